#include "policies/prefix_hash.hpp"

#include <cstring>

namespace pdgate::policy {
namespace {

constexpr std::uint64_t P1 = 0x9E3779B185EBCA87ull;
constexpr std::uint64_t P2 = 0xC2B2AE3D27D4EB4Full;
constexpr std::uint64_t P3 = 0x165667B19E3779F9ull;
constexpr std::uint64_t P4 = 0x85EBCA77C2B2AE63ull;
constexpr std::uint64_t P5 = 0x27D4EB2F165667C5ull;

constexpr std::uint64_t rotl(std::uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

// memcpy keeps unaligned loads legal; compilers turn it into one mov.
inline std::uint64_t read64(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline std::uint32_t read32(const char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline std::uint64_t round(std::uint64_t acc, std::uint64_t input) {
  acc += input * P2;
  acc = rotl(acc, 31);
  return acc * P1;
}

inline std::uint64_t merge(std::uint64_t acc, std::uint64_t val) {
  acc ^= round(0, val);
  return acc * P1 + P4;
}

}  // namespace

std::uint64_t hash64(std::string_view data, std::uint64_t seed) {
  const char* p = data.data();
  const char* const end = p + data.size();
  std::uint64_t h;
  if (data.size() >= 32) {
    // Four independent lanes keep the multiplier pipelines busy; this is
    // what makes the hash run at several GB/s.
    std::uint64_t v1 = seed + P1 + P2;
    std::uint64_t v2 = seed + P2;
    std::uint64_t v3 = seed;
    std::uint64_t v4 = seed - P1;
    const char* const limit = end - 32;
    do {
      v1 = round(v1, read64(p));
      v2 = round(v2, read64(p + 8));
      v3 = round(v3, read64(p + 16));
      v4 = round(v4, read64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge(h, v1);
    h = merge(h, v2);
    h = merge(h, v3);
    h = merge(h, v4);
  } else {
    h = seed + P5;
  }
  h += static_cast<std::uint64_t>(data.size());
  while (p + 8 <= end) {
    h ^= round(0, read64(p));
    h = rotl(h, 27) * P1 + P4;
    p += 8;
  }
  if (p + 4 <= end) {
    h ^= static_cast<std::uint64_t>(read32(p)) * P1;
    h = rotl(h, 23) * P2 + P3;
    p += 4;
  }
  while (p < end) {
    h ^= static_cast<std::uint64_t>(static_cast<unsigned char>(*p)) * P5;
    h = rotl(h, 11) * P1;
    ++p;
  }
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

std::vector<std::uint64_t> prefix_block_hashes(std::string_view text, std::size_t block_bytes) {
  std::vector<std::uint64_t> out;
  if (block_bytes == 0)
    return out;
  const std::size_t n = text.size() / block_bytes;
  out.reserve(n);
  std::uint64_t prev = 0;
  for (std::size_t i = 0; i < n; ++i) {
    // Seeding each block with the previous hash chains them: a block's
    // hash depends on every byte before it.
    prev = hash64(text.substr(i * block_bytes, block_bytes), prev);
    out.push_back(prev & kLuaExactMask);
  }
  return out;
}

}  // namespace pdgate::policy
