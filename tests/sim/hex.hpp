// Bytes as lowercase hex, to compare encodings with reference dumps.
#pragma once

#include <string>

namespace pdgate::sim::test {

inline std::string hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace pdgate::sim::test
