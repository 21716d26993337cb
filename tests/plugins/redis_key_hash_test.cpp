// The API-key hash as read from Redis (plugins/redis_key_hash.*): each
// entry is checked on its own, a bad one leaves only itself out, and what
// is said about the bad ones is bounded and printable.
#include "plugins/redis_key_hash.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "core/base/sha256.hpp"

namespace pdgate {
namespace {

using Pairs = std::vector<std::pair<std::string_view, std::string_view>>;

TEST(KeyHash, GoodEntriesKeptBadOnesLeftOutAndSaid) {
  const std::string good = *sha256_hex("sk-good");
  std::string upper = *sha256_hex("sk-upper");
  for (char& c : upper)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::string long_name = R"({"name":")" + std::string(kMaxKeyNameBytes + 1, 'n') + "\"}";
  const std::string long_hash = *sha256_hex("sk-long");
  const std::string bad_hash = *sha256_hex("sk-bad-json");
  const Pairs pairs = {
      {good, R"({"name":"good","labels":{"tier":"gold"}})"},
      {upper, R"({"name":"upper"})"},
      {"not\na-hash", R"({"name":"junk"})"},
      {"", R"({"name":"empty"})"},
      {long_hash, long_name},
      {bad_hash, "{"},
  };
  const KeyHashRead r = keys_from_hash(pairs);
  ASSERT_EQ(r.keys.size(), 1u);
  EXPECT_EQ(r.keys.at(good)->name, "good");
  EXPECT_EQ(r.keys.at(good)->labels.at("tier"), "gold");
  EXPECT_EQ(r.left_out, 5u);
  ASSERT_EQ(r.problems.size(), 5u);
  EXPECT_EQ(r.problems[0], "api key " + upper.substr(0, 8) +
                               "...: the field must be 64 lower-case hex digits, the SHA-256 of "
                               "the key");
  EXPECT_EQ(r.problems[1].rfind("api key not?a-ha...: the field", 0), 0u) << r.problems[1];
  EXPECT_NE(r.problems[3].find("the name is longer than 128 bytes"), std::string::npos);
  EXPECT_NE(r.problems[4].find(bad_hash.substr(0, 8) + "...: not a JSON object"), std::string::npos)
      << r.problems[4];
}

// Any number of bad entries: all counted, the first few said.
TEST(KeyHash, ProblemsAreBounded) {
  std::vector<std::string> fields;
  for (int i = 0; i < 1000; ++i)
    fields.push_back("f" + std::to_string(i));
  Pairs pairs;
  for (const auto& f : fields)
    pairs.emplace_back(f, "{}");
  const KeyHashRead r = keys_from_hash(pairs);
  EXPECT_TRUE(r.keys.empty());
  EXPECT_EQ(r.left_out, 1000u);
  EXPECT_EQ(r.problems.size(), kMaxKeyHashProblems);
}

}  // namespace
}  // namespace pdgate
