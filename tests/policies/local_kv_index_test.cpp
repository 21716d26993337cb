// The in-process KV-location index: prefix routes and conversation routes,
// their bounds, expiry, purge and late (remote) records.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "policies/local_kv_index.hpp"

namespace pdgate::policy {
namespace {

std::map<InstanceKey, std::size_t> as_map(
    const std::vector<std::pair<InstanceKey, std::size_t>>& m) {
  return {m.begin(), m.end()};
}

// The prefix index reports each instance's longest routed prefix and forgets old routes.
TEST(LocalKvIndex, PrefixMatchesAndExpiry) {
  PrefixIndex idx(1 << 12, 1000);
  idx.record({1, 2, 3, 4}, 7, 0);
  idx.record({1, 2, 9}, 8, 0);
  auto got = as_map(idx.matches({1, 2, 3, 5}, 10, 8));
  EXPECT_EQ(got[7], 3u);
  EXPECT_EQ(got[8], 2u);
  EXPECT_TRUE(idx.matches({1, 2, 3}, 2000, 8).empty());  // past the TTL
}

// Recording far more blocks than the capacity keeps at most about the capacity, newest kept.
TEST(LocalKvIndex, PrefixBounded) {
  PrefixIndex idx(1024, 600'000);
  for (std::uint64_t h = 1; h <= 100'000; ++h)
    idx.record({h}, 5, 1);
  EXPECT_EQ(idx.matches({100'000}, 2, 4).size(), 1u);  // recent: kept
  std::size_t kept = 0;
  for (std::uint64_t h = 1; h <= 100'000; ++h)
    kept += idx.matches({h}, 2, 4).size();
  EXPECT_LE(kept, 1024u + 16u);
  EXPECT_GE(kept, 1024u / 2);
}

// A block remembers its kWays most recent instances; a fifth pushes out the oldest.
TEST(LocalKvIndex, WaysPerBlock) {
  PrefixIndex idx(1 << 12, 600'000);
  for (InstanceKey k = 1; k <= PrefixIndex::kWays + 1; ++k)
    idx.record({42}, k, static_cast<std::int64_t>(k) * 10);
  const auto got = as_map(idx.matches({42}, 100, 16));
  EXPECT_EQ(got.size(), PrefixIndex::kWays);
  EXPECT_EQ(got.count(1), 0u);  // the oldest went
  EXPECT_EQ(got.count(PrefixIndex::kWays + 1), 1u);
}

// A late record (another replica's, caught up after an outage) neither ages a newer route
// of the same instance nor pushes out newer routes of others.
TEST(LocalKvIndex, LateRecordsDoNotRewindOrEvict) {
  PrefixIndex idx(1 << 12, 1000);
  idx.record({7}, 1, 900);
  idx.record({7}, 1, 100);                          // late: the route stays at 900
  EXPECT_EQ(idx.matches({7}, 1800, 4).size(), 1u);  // 900 + 1000 > 1800: still live
  for (InstanceKey k = 2; k <= PrefixIndex::kWays; ++k)
    idx.record({7}, k, 950);
  idx.record({7}, 99, 50);  // older than every route: ignored
  EXPECT_EQ(as_map(idx.matches({7}, 1000, 16)).count(99), 0u);
}

// Forgetting an instance hides what it was sent before; what it is sent afterwards counts.
TEST(LocalKvIndex, ForgetInstance) {
  LocalKvIndex idx(1 << 12, 10'000);
  idx.record_prefix({1, 2, 3}, 5, 100);
  idx.record_prefix({1, 2, 3}, 6, 100);
  idx.forget_instance(5, 200);
  auto got = as_map(idx.prefix_matches({1, 2, 3}, 300, 8));
  EXPECT_EQ(got.count(5), 0u);
  EXPECT_EQ(got[6], 3u);
  idx.record_prefix({1, 2}, 5, 400);  // back, with a fresh cache
  got = as_map(idx.prefix_matches({1, 2, 3}, 500, 8));
  EXPECT_EQ(got[5], 2u);
}

// Removals past the TTL stop taking room; many removals stay bounded per shard.
TEST(LocalKvIndex, ForgottenBounded) {
  PrefixIndex idx(1 << 12, 1000);
  for (InstanceKey k = 1; k <= 10 * PrefixIndex::kMaxForgotten; ++k)
    idx.forget(k, 10);
  idx.record({3}, 1, 20);  // recorded after its removal: counts
  EXPECT_EQ(idx.matches({3}, 30, 4).size(), 1u);
}

// The conversation table stays within its capacity and keeps the newest.
TEST(LocalKvIndex, ConversationTableBounded) {
  ConversationTable t(100);
  for (int i = 0; i < 1000; ++i)
    t.put("c" + std::to_string(i), ConversationRoute{1, 2, 3});
  EXPECT_TRUE(t.get("c999").has_value());
  EXPECT_FALSE(t.get("c0").has_value());
}

// Instance keys depend only on the normalized URL, so every replica computes the same one.
TEST(LocalKvIndex, InstanceKeyStable) {
  EXPECT_EQ(instance_key("http://10.0.0.1:8100"),
            instance_key(std::string("http://10.0.0.1:8100")));
  EXPECT_NE(instance_key("http://10.0.0.1:8100"), instance_key("http://10.0.0.1:8101"));
  EXPECT_NE(instance_key(""), 0u);
}

}  // namespace
}  // namespace pdgate::policy
