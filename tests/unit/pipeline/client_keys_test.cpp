// API keys and limits (core/pipeline/client_keys.*): the key file, bearer tokens,
// the GCRA arithmetic and the in-process limits, without servers.
#include "core/pipeline/client_keys.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/base/sha256.hpp"
#include "core/config/config.hpp"

namespace pdgate {
namespace {

std::string hash_of(std::string_view key) {
  return *sha256_hex(key);
}

// A key file lists hashed keys with labels and limits; they are found by
// the key's hash, nothing else.
TEST(KeyFile, ParsesKeysAndLimits) {
  const std::string yaml = "keys:\n  - name: team-a\n    sha256: " + hash_of("sk-a") +
                           "\n    labels: {tier: gold}\n    requests_per_second: 5\n"
                           "    burst: 10\n    concurrent: 2\n    tokens_per_minute: 1000\n"
                           "  - name: free\n    sha256: " +
                           hash_of("sk-free") + "\n";
  auto t = parse_key_file(yaml);
  ASSERT_TRUE(t) << t.error();
  ASSERT_EQ(t->size(), 2u);
  const auto& a = t->at(hash_of("sk-a"));
  EXPECT_EQ(a->name, "team-a");
  EXPECT_EQ(a->labels.at("tier"), "gold");
  EXPECT_DOUBLE_EQ(a->limits.requests_per_second, 5);
  EXPECT_DOUBLE_EQ(a->limits.bucket(), 10);
  EXPECT_EQ(a->limits.concurrent, 2u);
  EXPECT_EQ(a->limits.tokens_per_minute, 1000u);
  EXPECT_FALSE(t->at(hash_of("sk-free"))->limits.any());
}

// Every malformed entry is refused with a message naming it.
TEST(KeyFile, RefusesBadEntries) {
  const std::string h = hash_of("k");
  const std::pair<std::string, std::string> cases[] = {
      {"nokeys: []", "'keys' list"},
      {"keys:\n  - sha256: " + h, "key 1: needs a name"},
      {"keys:\n  - name: a\n    sha256: abc", "64 hex digits"},
      {"keys:\n  - name: a\n    sha256: " + h + "\n    requests_per_second: -1", "0 to"},
      {"keys:\n  - name: a\n    sha256: " + h + "\n    concurrent: lots", "concurrent"},
      {"keys:\n  - name: a\n    sha256: " + h + "\n    colour: red", "unknown field 'colour'"},
      {"keys:\n  - name: a\n    sha256: " + h + "\n  - name: b\n    sha256: " + h, "twice"},
      {"keys: [", "not valid YAML"},
  };
  for (const auto& [yaml, expect] : cases) {
    auto t = parse_key_file(yaml);
    ASSERT_FALSE(t) << yaml;
    EXPECT_NE(t.error().find(expect), std::string::npos) << t.error();
  }
}

// Keys kept in Redis are JSON with the same fields.
TEST(KeyFile, JsonEntries) {
  auto k = parse_key_json(R"({"name":"r","labels":{"tier":"std"},"requests_per_second":2})");
  ASSERT_TRUE(k) << k.error();
  EXPECT_EQ((*k)->name, "r");
  EXPECT_EQ((*k)->labels.at("tier"), "std");
  EXPECT_DOUBLE_EQ((*k)->limits.requests_per_second, 2);
  EXPECT_FALSE(parse_key_json("[]"));
  EXPECT_FALSE(parse_key_json(R"({"labels":{}})"));
  EXPECT_FALSE(parse_key_json(R"({"name":"x","labels":{"a":1}})"));
}

// A key's name and labels are bounded wherever the key comes from (issue
// 32): a name up to kMaxKeyNameBytes and labels within LabelLimits are
// kept, one byte or label more is refused with the bound named; a JSON
// document longer than kMaxKeyJsonBytes is not parsed.
TEST(KeyFile, NamesAndLabelsAreBounded) {
  const std::string h = hash_of("k");
  auto file = [&](const std::string& name, const std::string& labels) {
    return parse_key_file("keys:\n  - name: " + name + "\n    sha256: " + h + "\n    labels: {" +
                          labels + "}\n");
  };
  auto json = [](const std::string& name, const nlohmann::json& labels) {
    return parse_key_json(nlohmann::json{{"name", name}, {"labels", labels}}.dump());
  };
  const std::string longest(kMaxKeyNameBytes, 'n');
  std::string many_yaml;
  nlohmann::json many = nlohmann::json::object(), most = nlohmann::json::object();
  for (std::size_t i = 0; i <= LabelLimits::kMaxCount; ++i) {
    many_yaml += (i ? ", l" : "l") + std::to_string(i) + ": v";
    many["l" + std::to_string(i)] = "v";
    if (i < LabelLimits::kMaxCount)
      most["l" + std::to_string(i)] = "v";
  }
  ASSERT_TRUE(file(longest, "tier: gold"));
  ASSERT_TRUE(json(longest, most));
  EXPECT_EQ((*json(longest, most))->labels.size(), LabelLimits::kMaxCount);

  const std::pair<Result<KeyTable>, std::string> file_cases[] = {
      {file(longest + "n", ""), "key 1: the name is longer than 128 bytes (129)"},
      {file("a", many_yaml), "key 1: at most 64 labels per key (got 65)"},
      {file("a", "tier: " + std::string(LabelLimits::kMaxValueBytes + 1, 'v')), "1024 bytes"},
      {file("a", std::string(LabelLimits::kMaxKeyBytes + 1, 'k') + ": v"), "128 bytes"},
  };
  for (const auto& [t, expect] : file_cases) {
    ASSERT_FALSE(t) << expect;
    EXPECT_NE(t.error().find(expect), std::string::npos) << t.error();
  }
  const std::pair<Result<ClientKeyPtr>, std::string> json_cases[] = {
      {json(longest + "n", nlohmann::json::object()), "the name is longer than 128 bytes"},
      {json("a", many), "at most 64 labels per key (got 65)"},
      {json("a", {{"", "v"}}), "must not be empty"},
      {json("a", {{"t", std::string(LabelLimits::kMaxValueBytes + 1, 'v')}}), "1024 bytes"},
      {parse_key_json(R"({"name":"a","pad":")" + std::string(kMaxKeyJsonBytes, ' ') + R"("})"),
       "longer than 65536 bytes"},
  };
  for (const auto& [k, expect] : json_cases) {
    ASSERT_FALSE(k) << expect;
    EXPECT_NE(k.error().find(expect), std::string::npos) << k.error();
  }
}

// Only "Bearer <token>" carries a key (scheme case-insensitive).
TEST(BearerToken, Extracts) {
  EXPECT_EQ(bearer_token("Bearer sk-1"), "sk-1");
  EXPECT_EQ(bearer_token("bearer   sk-1 "), "sk-1");
  EXPECT_EQ(bearer_token("Basic abc"), "");
  EXPECT_EQ(bearer_token(""), "");
  EXPECT_EQ(bearer_token("Bearer"), "");
}

// GCRA admits `bucket` requests at once, then one per interval, and says
// how long to wait when refused.
TEST(Gcra, BurstThenSteadyRate) {
  double tat = 0;
  int admitted = 0;
  for (int i = 0; i < 5; ++i) {
    auto s = gcra_step(tat, 1000, 10, 3);  // 10/s, bucket 3, all at t=1000 ms
    if (s.allowed) {
      ++admitted;
      tat = s.tat_ms;
    } else {
      EXPECT_EQ(s.retry_after_ms, 100);
      EXPECT_DOUBLE_EQ(s.tat_ms, tat);
    }
  }
  EXPECT_EQ(admitted, 3);
  // 100 ms later one more fits, not two.
  auto s = gcra_step(tat, 1100, 10, 3);
  ASSERT_TRUE(s.allowed);
  EXPECT_FALSE(gcra_step(s.tat_ms, 1100, 10, 3).allowed);
  // Over a long run the rate is the configured one.
  tat = 0;
  admitted = 0;
  for (int ms = 0; ms < 10'000; ++ms) {
    auto r = gcra_step(tat, ms, 10, 1);
    if (r.allowed) {
      ++admitted;
      tat = r.tat_ms;
    }
  }
  EXPECT_EQ(admitted, 100);
}

ClientKey key_with(KeyLimits l) {
  ClientKey k;
  k.name = "k";
  k.limits = l;
  return k;
}

// Concurrent requests beyond the limit wait for a release.
TEST(LocalLimits, Concurrency) {
  LocalLimits limits;
  KeyLimits l;
  l.concurrent = 2;
  const auto k = key_with(l);
  EXPECT_EQ(limits.admit(k, "a", 0).verdict, Admission::Verdict::admitted);
  EXPECT_EQ(limits.admit(k, "b", 0).verdict, Admission::Verdict::admitted);
  auto third = limits.admit(k, "c", 0);
  EXPECT_EQ(third.verdict, Admission::Verdict::limited);
  EXPECT_EQ(third.reason, "concurrency");
  limits.release(k, 0, 1);
  EXPECT_EQ(limits.admit(k, "c", 2).verdict, Admission::Verdict::admitted);
}

// Tokens used count for a minute from the second they were used in (61
// one-second buckets); then the key has room again.
TEST(LocalLimits, TokensPerMinute) {
  LocalLimits limits;
  KeyLimits l;
  l.tokens_per_minute = 100;
  const auto k = key_with(l);
  ASSERT_EQ(limits.admit(k, "a", 1000).verdict, Admission::Verdict::admitted);
  limits.release(k, 120, 2000);
  auto over = limits.admit(k, "b", 3000);
  EXPECT_EQ(over.verdict, Admission::Verdict::limited);
  EXPECT_EQ(over.reason, "tokens");
  EXPECT_EQ(over.retry_after.count(), 60000);
  EXPECT_EQ(limits.admit(k, "c", 62'999).verdict, Admission::Verdict::limited);
  EXPECT_EQ(limits.admit(k, "c", 63'000).verdict, Admission::Verdict::admitted);
}

// The window's memory is bounded by its span, not by the request rate:
// tokens used every 10 ms for ten minutes leave at most 61 buckets, which
// hold exactly the tokens of the last 61 seconds.
TEST(TokenWindow, BucketsAreBoundedAndHoldTheLastMinute) {
  TokenWindow w;
  std::size_t most = 0;
  double now = 0;
  for (int i = 0; i < 60'000; ++i, now += 10) {
    w.add(now, 1);
    most = std::max(most, w.buckets());
  }
  EXPECT_LE(most, 61u);
  // The last add was at 599,990 ms: seconds 539 to 599 are in the window.
  EXPECT_EQ(w.used(now - 10), 61u * 100u);
  EXPECT_EQ(w.wait_below_ms(now - 10, 6000), static_cast<std::int64_t>(601'000 - (now - 10)));
}

// Tokens are counted over the last minute, not the calendar one (issue 29,
// item 5): tokens used just before a minute's boundary still count just
// after it, and the wait given is until they are a minute old.
TEST(LocalLimits, TokensSlideAcrossTheMinutesBoundary) {
  LocalLimits limits;
  KeyLimits l;
  l.tokens_per_minute = 100;
  const auto k = key_with(l);
  ASSERT_EQ(limits.admit(k, "a", 30'000).verdict, Admission::Verdict::admitted);
  limits.release(k, 60, 30'500);
  ASSERT_EQ(limits.admit(k, "b", 59'000).verdict, Admission::Verdict::admitted);
  limits.release(k, 50, 59'900);
  auto over = limits.admit(k, "c", 60'100);
  EXPECT_EQ(over.verdict, Admission::Verdict::limited);
  EXPECT_EQ(over.reason, "tokens");
  // The 60 tokens of 30.5 s leave the window in its second's 61st second:
  // at 91 s, 30.9 s from now (the exact wait, 30.4 s, plus at most 1 s).
  EXPECT_EQ(over.retry_after.count(), 30'900);
  EXPECT_EQ(limits.admit(k, "d", 90'900).verdict, Admission::Verdict::limited);
  EXPECT_EQ(limits.admit(k, "e", 91'000).verdict, Admission::Verdict::admitted);
}

// A refused request (rate) does not hold a concurrency slot.
TEST(LocalLimits, RateRefusalTakesNoSlot) {
  LocalLimits limits;
  KeyLimits l;
  l.requests_per_second = 1;
  l.concurrent = 1;
  const auto k = key_with(l);
  ASSERT_EQ(limits.admit(k, "a", 0).verdict, Admission::Verdict::admitted);
  limits.release(k, 0, 10);
  EXPECT_EQ(limits.admit(k, "b", 10).reason, "rate");
  EXPECT_EQ(limits.admit(k, "c", 1000).verdict, Admission::Verdict::admitted);
}

}  // namespace
}  // namespace pdgate
