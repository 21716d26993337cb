#include "plugins/redis_key_hash.hpp"

#include <algorithm>

namespace pdgate {

namespace {

// Text read from Redis goes into a log line: no control bytes, bounded.
std::string printable(std::string_view s, std::size_t max) {
  std::string out;
  for (char c : s.substr(0, max))
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > max)
    out += "...";
  return out;
}

}  // namespace

KeyHashRead keys_from_hash(
    const std::vector<std::pair<std::string_view, std::string_view>>& pairs) {
  KeyHashRead out;
  auto refuse = [&](std::string_view field, const std::string& why) {
    ++out.left_out;
    if (out.problems.size() < kMaxKeyHashProblems)
      out.problems.push_back("api key " + printable(field, 8) + ": " + printable(why, 200));
  };
  for (const auto& [field, value] : pairs) {
    // Lookups hash the presented key to lower-case hex: any other field
    // could never match, and is a mistake worth saying.
    if (!is_key_hash(field)) {
      refuse(field, "the field must be 64 lower-case hex digits, the SHA-256 of the key");
      continue;
    }
    auto key = parse_key_json(value);
    if (!key) {
      refuse(field, key.error());
      continue;
    }
    out.keys.emplace(std::string(field), std::move(*key));
  }
  return out;
}

}  // namespace pdgate
