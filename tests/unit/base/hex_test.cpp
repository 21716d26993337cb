// Lowercase hex (core/base/hex.hpp): the block conversion writes exactly what
// a digit-table loop writes, for every length and every byte value.
#include "core/base/hex.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace pdgate {
namespace {

std::string reference(const std::vector<std::uint8_t>& bytes) {
  std::string out;
  for (std::uint8_t b : bytes) {
    out += "0123456789abcdef"[b >> 4];
    out += "0123456789abcdef"[b & 0x0f];
  }
  return out;
}

std::string encoded(const std::vector<std::uint8_t>& bytes) {
  // One guard byte past the digits: nothing may be written there.
  std::string out(2 * bytes.size() + 1, '#');
  hex_encode(bytes.data(), bytes.size(), out.data());
  EXPECT_EQ(out.back(), '#');
  out.pop_back();
  return out;
}

TEST(Hex, EveryByteValue) {
  std::vector<std::uint8_t> all(256);
  for (int i = 0; i < 256; ++i)
    all[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
  EXPECT_EQ(encoded(all), reference(all));
  EXPECT_EQ(encoded({0x00, 0x09, 0x0a, 0x0f, 0x90, 0xa0, 0xff}), "00090a0f90a0ff");
}

TEST(Hex, EveryLengthUpToThreeBlocks) {
  std::mt19937 rng(7);
  for (std::size_t n = 0; n <= 48; ++n) {
    for (int round = 0; round < 20; ++round) {
      std::vector<std::uint8_t> bytes(n);
      for (auto& b : bytes)
        b = static_cast<std::uint8_t>(rng());
      ASSERT_EQ(encoded(bytes), reference(bytes)) << n << " bytes";
    }
  }
}

}  // namespace
}  // namespace pdgate
