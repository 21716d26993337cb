#include "core/request_ids.hpp"

#include <cstring>

namespace pdgate {

namespace {

constexpr char kHex[] = "0123456789abcdef";

}  // namespace

RequestIds::RequestIds()
    : rng_(std::random_device{}() ^ (std::uint64_t{std::random_device{}()} << 32)) {}

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
  std::string s(36, '-');
  std::size_t at = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10)
      ++at;  // the dash already there
    s[at++] = kHex[b[i] >> 4];
    s[at++] = kHex[b[i] & 0xf];
  }
  return s;
}

std::string RequestIds::uuid_hex() {
  const auto b = next_uuid_bytes();
  std::string s(32, '0');
  for (std::size_t i = 0; i < b.size(); ++i) {
    s[2 * i] = kHex[b[i] >> 4];
    s[2 * i + 1] = kHex[b[i] & 0xf];
  }
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
    s[i] = kHex[bits & 0xf];
    bits >>= 4;
  }
  return s;
}

}  // namespace pdgate
