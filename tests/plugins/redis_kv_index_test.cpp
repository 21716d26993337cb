// The shared KV-location index between two in-process replicas over a real redis-server:
// propagation, Redis outages, the queue bound, and which records are applied.
#include <gtest/gtest.h>

#include <map>

#include "core/upstream/instance.hpp"
#include "plugins/redis_kv_index.hpp"
#include "policies/local_kv_index.hpp"
#include "tests/integration/harness.hpp"
#include "tests/plugins/redis_server.hpp"

namespace pdgate::test {
namespace {

using namespace std::chrono_literals;

std::int64_t steady() {
  return steady_now_ms();
}

struct Replica {
  explicit Replica(const RedisServer& redis, RedisKvIndexSettings s = {})
      : local(std::make_shared<policy::LocalKvIndex>()), index(local, [&] {
          s.redis_url = redis.url();
          s.retry_interval = 20ms;
          return s;
        }()) {
    EXPECT_TRUE(index.start().ok());
  }
  // Leading blocks of `hashes` this replica believes `where` holds (0: none).
  std::size_t match(const std::vector<std::uint64_t>& hashes, InstanceKey where) {
    for (const auto& [k, n] : index.prefix_matches(hashes, steady(), 16)) {
      if (k == where)
        return n;
    }
    return 0;
  }
  std::shared_ptr<policy::LocalKvIndex> local;
  RedisKvIndex index;
};

// A prefix and a conversation recorded on A are known to B within 100 ms.
TEST(RedisKvIndex, RecordOnAFoundOnBWithin100ms) {
  RedisServer redis;
  Replica a(redis), b(redis);
  // Both connected: a first record round-trips.
  a.index.record_prefix({1}, 9, steady());
  ASSERT_TRUE(eventually([&] { return b.match({1}, 9) == 1; }, 5s));
  const auto t0 = Clock::now();
  a.index.record_prefix({10, 11, 12}, 5, steady());
  a.index.record_conversation("conv-1", ConversationRoute{5, 6, steady()});
  ASSERT_TRUE(eventually(
      [&] {
        return b.match({10, 11, 12, 13}, 5) == 3 && b.index.conversation("conv-1");
      },
      2s));
  EXPECT_LT(Clock::now() - t0, 100ms);
  EXPECT_EQ(b.index.conversation("conv-1")->decode, 5u);
  EXPECT_EQ(b.index.conversation("conv-1")->prefill, 6u);
  EXPECT_GE(a.index.stats().published.load(), 3u);
  EXPECT_GE(b.index.stats().applied.load(), 3u);
  EXPECT_EQ(a.index.stats().applied.load(), 0u);  // its own records are not applied twice
}

// Redis down: records made meanwhile stay queued, and reach the other replica once Redis
// is back (a fresh, empty Redis); a replica started afterwards catches up from the stream.
TEST(RedisKvIndex, OutageQueuedThenCaughtUp) {
  RedisServer redis;
  Replica a(redis), b(redis);
  a.index.record_prefix({1}, 9, steady());
  ASSERT_TRUE(eventually([&] { return b.match({1}, 9) == 1; }, 5s));
  redis.kill();
  a.index.record_prefix({20, 21}, 7, steady());
  EXPECT_EQ(a.match({20, 21}, 7), 2u);  // local lookups go on
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(b.match({20, 21}, 7), 0u);
  redis.restart();
  EXPECT_TRUE(eventually([&] { return b.match({20, 21}, 7) == 2; }, 10s));
  Replica c(redis);
  EXPECT_TRUE(eventually([&] { return c.match({20, 21}, 7) == 2; }, 5s));
}

// With Redis unreachable the queue stays within its byte bound; what it sheds is counted.
TEST(RedisKvIndex, QueueBoundedWhileDown) {
  RedisServer redis;
  redis.kill();
  RedisKvIndexSettings s;
  s.max_queued_bytes = 64 << 10;
  s.batch_bytes = 8 << 10;
  Replica a(redis, s);
  const std::vector<std::uint64_t> hashes(100, 3);  // 821 bytes a record
  for (int i = 0; i < 1000; ++i)
    a.index.record_prefix(hashes, 1, steady());
  EXPECT_LE(a.index.stats().queued_bytes.load(), s.max_queued_bytes);
  EXPECT_GE(a.index.stats().dropped.load(), 1000u - (64u << 10) / 821u - 10u);
  EXPECT_EQ(a.match(hashes, 1), 100u);
}

// Applying: a batch from this replica is skipped, records past the TTL are skipped, and a
// late conversation record never replaces a newer turn's route.
TEST(RedisKvIndex, ApplyRules) {
  RedisKvIndexSettings s;
  s.ttl_ms = 1000;
  auto local = std::make_shared<policy::LocalKvIndex>(1 << 12, 1000);
  RedisKvIndex idx(local, s);  // never started: apply() alone
  kv_wire::Batch own;
  own.origin = idx.origin();
  own.prefixes.push_back({5, 10'000, {1}});
  idx.apply(own, 10'000, 500);
  EXPECT_TRUE(local->prefix_matches({1}, 500, 4).empty());

  kv_wire::Batch other;
  other.origin = idx.origin() + 1;
  other.prefixes.push_back({5, 9'800, {1}});  // 200 ms old: kept, dated 200 ms ago
  other.prefixes.push_back({6, 8'000, {1}});  // past the TTL: skipped
  other.conversations.push_back({"c", 5, 6, 9'900});
  idx.apply(other, 10'000, 500);
  const auto m = local->prefix_matches({1}, 500, 4);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].first, 5u);
  EXPECT_TRUE(local->prefix_matches({1}, 500 + 801, 4).empty());  // its age counted
  EXPECT_EQ(idx.stats().applied.load(), 2u);
  EXPECT_EQ(idx.stats().lag_ms.load(), 100);

  local->record_conversation("c", ConversationRoute{7, 0, 495});
  kv_wire::Batch late;
  late.origin = other.origin;
  late.conversations.push_back({"c", 5, 6, 9'950});  // dated 450, before the local 495
  idx.apply(late, 10'000, 500);
  EXPECT_EQ(local->conversation("c")->decode, 7u);
}

}  // namespace
}  // namespace pdgate::test
