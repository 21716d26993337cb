// The random ids the sim makes up: request ids, remote_request_ids, the
// model permission id and the engine id. Shared by the server and the KV
// hand-off, which both draw from the engine's one seeded RNG.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

namespace pdgate::sim {

// `n` lowercase hex digits.
inline std::string random_hex(std::mt19937_64& rng, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(n, '0');
  for (char& c : s)
    c = kHex[rng() & 15];
  return s;
}

// A version-4 UUID from its own RNG seeded with `seed`.
inline std::string random_uuid(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string h = random_hex(rng, 32);
  h[12] = '4';
  h[16] = "89ab"[rng() & 3];
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) +
         "-" + h.substr(20);
}

}  // namespace pdgate::sim
