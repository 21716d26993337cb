// The API keys kept in Redis (--api-keys-from-redis): the hash
// <prefix>api_keys maps the hex SHA-256 of a key to its JSON
// (parse_key_json, core/pipeline/client_keys.hpp). Reading the hash's
// fields and values into a key table is apart from the refresh loop
// (plugins/redis_client_keys.cpp) so that it is fuzzed
// (tests/fuzz/fuzz_client_keys.cpp) and unit-tested without a server:
// whatever another process wrote there is hostile.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/pipeline/client_keys.hpp"

namespace pdgate {

// Why entries were left out, kept for at most this many of them (the
// hash may hold any number of bad entries; the log shows the first).
inline constexpr std::size_t kMaxKeyHashProblems = 8;

struct KeyHashRead {
  KeyTable keys;
  // Entries refused: a field that is not 64 lower-case hex digits, or a
  // JSON document parse_key_json refuses (past the bounds on a key's
  // name and labels included).
  std::size_t left_out = 0;
  // "<first bytes of the field>...: why" for the first of them, printable.
  std::vector<std::string> problems;
};

// The hash's (field, value) pairs into keys; a bad entry leaves only
// itself out.
KeyHashRead keys_from_hash(const std::vector<std::pair<std::string_view, std::string_view>>& pairs);

}  // namespace pdgate
