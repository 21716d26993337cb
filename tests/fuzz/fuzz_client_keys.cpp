// API keys as read from where others write them: the Redis hash
// <prefix>api_keys (plugins/redis_key_hash.*: field and JSON document
// through parse_key_json), a key file (parse_key_file), and a presented
// key (bearer_token, then the key table's lookup through sha256_hex). The
// first byte picks the mode; for the hash, the rest is split at NUL into
// field, value, field, value... Whatever the bytes: no crash, every key
// kept has a trimmed non-empty name of at most kMaxKeyNameBytes and labels
// within LabelLimits, the hash reader agrees with parse_key_json entry by
// entry, and only the one configured key is ever found.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/sha256.hpp"
#include "core/base/text.hpp"
#include "core/config/config.hpp"
#include "core/pipeline/client_keys.hpp"
#include "plugins/redis_key_hash.hpp"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant failed: %s\n", what);
    std::abort();
  }
}

void check_key(const pdgate::ClientKey& k) {
  check(!k.name.empty(), "a kept key has a name");
  check(k.name.size() <= pdgate::kMaxKeyNameBytes, "name bounded");
  check(pdgate::trim(k.name) == k.name, "name trimmed");
  check(!pdgate::label_problem(k.labels, "key"), "labels within the bounds");
  const auto& l = k.limits;
  check(l.requests_per_second >= 0 && l.requests_per_second <= 1e6, "rate in range");
  check(l.burst >= 0 && l.burst <= 1e6, "burst in range");
  check(l.concurrent <= 1000000, "concurrency in range");
  check(l.tokens_per_minute <= 1000000000000000ull, "tokens in range");
}

void fuzz_hash(std::string_view bytes) {
  std::vector<std::string_view> parts;
  std::size_t pos = 0;
  while (pos <= bytes.size()) {
    std::size_t end = bytes.find('\0', pos);
    if (end == std::string_view::npos)
      end = bytes.size();
    parts.push_back(bytes.substr(pos, end - pos));
    pos = end + 1;
  }
  std::vector<std::pair<std::string_view, std::string_view>> pairs;
  for (std::size_t i = 0; i + 1 < parts.size(); i += 2)
    pairs.emplace_back(parts[i], parts[i + 1]);
  // One document alone (no field): through parse_key_json only.
  if (pairs.empty())
    pairs.emplace_back(std::string_view(), parts[0]);

  const pdgate::KeyHashRead read = pdgate::keys_from_hash(pairs);
  check(read.keys.size() + read.left_out <= pairs.size(), "each entry kept or left out once");
  check(read.problems.size() == std::min(read.left_out, pdgate::kMaxKeyHashProblems),
        "the first problems said, no more");
  for (const auto& p : read.problems) {
    check(p.size() <= 300, "a problem is a bounded line");
    for (char c : p)
      check(c >= 0x20 && c < 0x7f, "a problem is printable");
  }
  for (const auto& [hex, key] : read.keys) {
    check(pdgate::is_key_hash(hex), "kept under a lower-case SHA-256");
    check(key != nullptr, "a kept key is there");
    check_key(*key);
  }
  std::size_t good = 0;
  for (const auto& [field, value] : pairs) {
    const auto key = pdgate::parse_key_json(value);
    if (key) {
      check(value.size() <= pdgate::kMaxKeyJsonBytes, "documents bounded");
      check_key(**key);
    }
    const bool kept = pdgate::is_key_hash(field) && key.ok();
    good += kept;
    if (kept)
      check(read.keys.count(std::string(field)) == 1, "a good entry is kept");
  }
  check(read.left_out == pairs.size() - good, "every bad entry left out, no good one");
}

void fuzz_file(std::string_view yaml) {
  const auto table = pdgate::parse_key_file(yaml);
  if (!table) {
    check(!table.error().empty(), "a refusal says why");
    return;
  }
  for (const auto& [hex, key] : *table) {
    check(pdgate::is_key_hash(hex), "kept under a lower-case SHA-256");
    check_key(*key);
  }
}

// The one key the lookup knows.
constexpr std::string_view kKnown = "sk-fuzz-known";

const pdgate::ClientKeys& known_keys() {
  static const std::unique_ptr<pdgate::ClientKeys> keys = [] {
    pdgate::KeyTable t;
    t.emplace(*pdgate::sha256_hex(kKnown),
              std::make_shared<const pdgate::ClientKey>(pdgate::ClientKey{"known", {}, {}}));
    return pdgate::make_local_client_keys(std::move(t));
  }();
  return *keys;
}

void fuzz_presented(std::string_view authorization) {
  const std::string_view token = pdgate::bearer_token(authorization);
  if (!token.empty()) {
    check(token.data() >= authorization.data() &&
              token.data() + token.size() <= authorization.data() + authorization.size(),
          "the token is part of the header");
    check(pdgate::trim(token) == token, "the token is trimmed");
    const auto hex = pdgate::sha256_hex(token);
    check(hex && pdgate::is_key_hash(*hex), "a token hashes to a key hash");
  }
  const auto found = known_keys().find(token);
  check((found != nullptr) == (token == kKnown), "only the known key is found");
  check(known_keys().find(authorization) == nullptr || authorization == kKnown,
        "a raw header is no key");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0)
    return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      fuzz_hash(bytes);
      break;
    case 1:
      fuzz_file(bytes);
      break;
    default:
      fuzz_presented(bytes);
      break;
  }
  return 0;
}
