// The pseudo-random generator behind a worker's request, trace and span
// ids: xoshiro256** (Blackman and Vigna), 256 bits of state, seeded from
// the OS once per worker. It takes a few instructions per 64 bits where
// std::mt19937_64 took ~45 and regenerated its 2.5 KiB state every 312
// draws; ids need unpredictability between workers and restarts, not
// cryptographic strength (nothing is authorized by an id).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <random>

namespace pdgate {

class IdRng {
 public:
  using result_type = std::uint64_t;

  // Seeded from std::random_device (the OS), all 256 bits.
  IdRng() {
    std::random_device os;
    for (auto& word : s_)
      word = (std::uint64_t{os()} << 32) ^ os();
    if (s_ == std::array<std::uint64_t, 4>{})
      s_[0] = 1;  // the one state the generator cannot leave
  }
  // Reproducible, for tests: the state expanded from `seed` by SplitMix64,
  // as the generator's authors advise (never all zero).
  explicit IdRng(std::uint64_t seed) {
    for (auto& word : s_) {
      seed += 0x9e3779b97f4a7c15ULL;
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      word = z ^ (z >> 31);
    }
  }

  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }

  result_type operator()() {
    const std::uint64_t out = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return out;
  }

 private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  std::array<std::uint64_t, 4> s_{};
};

}  // namespace pdgate
