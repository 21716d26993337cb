#include "core/observability/request_ids.hpp"

#include <cstring>

#include "core/base/hex.hpp"

namespace pdgate {

std::array<std::uint8_t, 16> RequestIds::next_uuid_bytes() {
  std::array<std::uint8_t, 16> b;
  const std::uint64_t hi = rng_();
  const std::uint64_t lo = rng_();
  std::memcpy(b.data(), &hi, 8);
  std::memcpy(b.data() + 8, &lo, 8);
  b[6] = static_cast<std::uint8_t>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<std::uint8_t>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return b;
}

std::string RequestIds::uuid() {
  const auto b = next_uuid_bytes();
  char digits[32];
  hex_encode(b.data(), b.size(), digits);
  // 8-4-4-4-12 digits.
  std::string s(36, '-');
  std::memcpy(s.data(), digits, 8);
  std::memcpy(s.data() + 9, digits + 8, 4);
  std::memcpy(s.data() + 14, digits + 12, 4);
  std::memcpy(s.data() + 19, digits + 16, 4);
  std::memcpy(s.data() + 24, digits + 20, 12);
  return s;
}

std::string RequestIds::uuid_hex() {
  const auto b = next_uuid_bytes();
  std::string s(32, '0');
  hex_encode(b.data(), b.size(), s.data());
  return s;
}

std::string RequestIds::hex(std::size_t n) {
  if (n > 32)
    n = 32;
  std::string s(n, '0');
  std::uint64_t bits = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 16 == 0)
      bits = rng_();
    s[i] = kHexDigits[bits & 0xf];
    bits >>= 4;
  }
  return s;
}

}  // namespace pdgate
