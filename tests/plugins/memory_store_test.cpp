// The in-memory conversation store: single use, TTL, the LRU cap and its
// counters, with time passed in (no sleeping).
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include "plugins/conversation_stores.hpp"
#include "plugins/memory_conversation_store.hpp"

namespace pdgate {
namespace {

using namespace std::chrono_literals;
using Clock = ConversationMap::Clock;

// A stored entry is returned once, then gone: the second take misses.
TEST(ConversationMap, SingleUse) {
  ConversationCounters c;
  ConversationMap m(10, c);
  const auto t0 = Clock::now();
  m.put("a", "{\"x\":1}", t0, 450s);
  auto first = m.take("a", t0 + 1s);
  EXPECT_EQ(first.kind, TakeResult::Kind::hit);
  EXPECT_EQ(first.params, "{\"x\":1}");
  EXPECT_EQ(m.take("a", t0 + 2s).kind, TakeResult::Kind::miss);
  // Finding an entry is no hit yet (the caller judges its history).
  EXPECT_EQ(c.hits.load(), 0u);
  EXPECT_EQ(c.misses_none.load(), 1u);
  EXPECT_EQ(c.puts.load(), 1u);
  EXPECT_EQ(m.size(), 0u);
}

// An entry taken at or after its TTL is a miss, counted as expired.
TEST(ConversationMap, TtlExpiry) {
  ConversationCounters c;
  ConversationMap m(10, c);
  const auto t0 = Clock::now();
  m.put("a", "{}", t0, 10s);
  EXPECT_EQ(m.take("a", t0 + 10s).kind, TakeResult::Kind::miss);
  EXPECT_EQ(c.expired.load(), 1u);
  EXPECT_EQ(c.misses_none.load(), 1u);
  EXPECT_EQ(m.size(), 0u);
}

// A put replaces the conversation's previous entry and refreshes its TTL.
TEST(ConversationMap, PutReplaces) {
  ConversationCounters c;
  ConversationMap m(10, c);
  const auto t0 = Clock::now();
  m.put("a", "{\"turn\":1}", t0, 10s);
  m.put("a", "{\"turn\":2}", t0 + 8s, 10s);
  EXPECT_EQ(m.size(), 1u);
  auto r = m.take("a", t0 + 15s);
  EXPECT_EQ(r.kind, TakeResult::Kind::hit);
  EXPECT_EQ(r.params, "{\"turn\":2}");
}

// Past the cap the least recently stored live entry is evicted and counted.
TEST(ConversationMap, LruCap) {
  ConversationCounters c;
  ConversationMap m(3, c);
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i)
    m.put("c" + std::to_string(i), "{}", t0 + std::chrono::seconds(i), 450s);
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(c.evicted.load(), 2u);
  EXPECT_EQ(m.take("c0", t0 + 10s).kind, TakeResult::Kind::miss);
  EXPECT_EQ(m.take("c1", t0 + 10s).kind, TakeResult::Kind::miss);
  EXPECT_EQ(m.take("c4", t0 + 10s).kind, TakeResult::Kind::hit);
}

// Expired entries at the back are dropped by later puts, so the map holds
// only live entries without a timer; they count as expired, not evicted.
TEST(ConversationMap, PutSweepsExpired) {
  ConversationCounters c;
  ConversationMap m(100, c);
  const auto t0 = Clock::now();
  for (int i = 0; i < 10; ++i)
    m.put("old" + std::to_string(i), "{}", t0, 5s);
  m.put("new", "{}", t0 + 6s, 5s);
  EXPECT_EQ(m.size(), 1u);
  EXPECT_EQ(c.expired.load(), 10u);
  EXPECT_EQ(c.evicted.load(), 0u);
}

// Through the factory: the memory kind, shared by handles of different
// workers (a put on one is taken on the other), health counts entries,
// oversized values are refused.
TEST(MemoryConversationStores, HandlesShareOneMap) {
  ConversationStoreOptions o;
  o.max_value_bytes = 16;
  auto stores = make_conversation_stores(o);
  ASSERT_TRUE(stores) << stores.error();
  net::io_context io1, io2;
  auto h1 = (*stores)->make_handle(io1.get_executor());
  auto h2 = (*stores)->make_handle(io2.get_executor());
  auto put = net::co_spawn(io1, h1->put("conv", "{\"p\":1}", 60s), net::use_future);
  auto big = net::co_spawn(io1, h1->put("big", std::string(100, 'x'), 60s), net::use_future);
  io1.run();
  EXPECT_TRUE(put.get());
  EXPECT_FALSE(big.get());
  EXPECT_EQ((*stores)->health().kind, "memory");
  EXPECT_EQ((*stores)->health().entries, 1u);
  auto t = net::co_spawn(io2, h2->take("conv"), net::use_future);
  io2.run();
  auto r = t.get();
  EXPECT_EQ(r.kind, TakeResult::Kind::hit);
  EXPECT_EQ(r.params, "{\"p\":1}");
}

// A malformed --redis URL fails the factory instead of starting a store.
TEST(MemoryConversationStores, FactoryRejectsBadUrl) {
  ConversationStoreOptions o;
  o.redis_url = "redis://";
  EXPECT_FALSE(make_conversation_stores(o));
}

}  // namespace
}  // namespace pdgate
