// The Redis conversation store against a real redis-server started by the
// test: single use, atomic take across connections, TTL, and outages
// (killed, frozen, restarted) handled as misses without a restart.
#include <gtest/gtest.h>

#include <unistd.h>

#include <future>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include "plugins/conversation_stores.hpp"
#include "plugins/redis_connection.hpp"
#include "tests/plugins/redis_server.hpp"

namespace pdgate::test {
namespace {

using namespace std::chrono_literals;

// Runs `a` on `io` (whose reconnect loop never lets run() return by
// itself) until it completes.
template <typename T>
T await_on(net::io_context& io, net::awaitable<T> a) {
  auto fut = net::co_spawn(io, std::move(a), net::use_future);
  while (fut.wait_for(0s) != std::future_status::ready)
    io.run_one_for(10ms);
  return fut.get();
}

class RedisStore : public ::testing::Test {
 protected:
  void SetUp() override { redis = std::make_unique<RedisServer>(); }

  std::unique_ptr<ConversationStores> make_stores(std::string url = {},
                                                  std::string prefix = "pdgate:") {
    ConversationStoreOptions o;
    o.redis_url = url.empty() ? redis->url() : url;
    o.key_prefix = std::move(prefix);
    o.reconnect_min = 50ms;
    o.reconnect_max = 200ms;
    auto s = make_conversation_stores(o);
    EXPECT_TRUE(s) << s.error();
    return std::move(*s);
  }

  // Drives `io` until every handle on it is connected.
  static bool wait_reachable(net::io_context& io, ConversationStores& s,
                             std::chrono::milliseconds limit = 5s) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (s.health().reachable)
        return true;
      io.run_one_for(10ms);
    }
    return false;
  }

  std::unique_ptr<RedisServer> redis;
};

// A put is a SET with the prefix and an expiry; the first take returns it
// and deletes it, the second misses; counters say so.
TEST_F(RedisStore, PutThenTakeOnce) {
  auto stores = make_stores();
  net::io_context io;
  auto h = stores->make_handle(io.get_executor());
  ASSERT_TRUE(wait_reachable(io, *stores));
  EXPECT_TRUE(await_on(io, h->put("c1", R"({"remote_host":"d"})", 450s)));
  const int ttl = std::stoi(redis->cli("TTL pdgate:conv:c1"));
  EXPECT_GT(ttl, 440);
  EXPECT_LE(ttl, 450);
  auto first = await_on(io, h->take("c1"));
  EXPECT_EQ(first.kind, TakeResult::Kind::hit);
  EXPECT_EQ(first.params, R"({"remote_host":"d"})");
  EXPECT_EQ(await_on(io, h->take("c1")).kind, TakeResult::Kind::miss);
  EXPECT_EQ(redis->cli("EXISTS pdgate:conv:c1"), "0");
  auto& c = stores->counters();
  EXPECT_EQ(c.puts.load(), 1u);
  EXPECT_EQ(c.hits.load(), 0u);  // judged by the caller, not the store
  EXPECT_EQ(c.misses_none.load(), 1u);
  EXPECT_EQ(c.errors.load(), 0u);
  auto health = stores->health();
  EXPECT_EQ(health.kind, "redis");
  EXPECT_TRUE(health.reachable);
  EXPECT_FALSE(health.entries);
}

// The key prefix is configurable: two prefixes do not see each other.
TEST_F(RedisStore, KeyPrefix) {
  auto a = make_stores({}, "tenant-a:");
  auto b = make_stores({}, "tenant-b:");
  net::io_context io;
  auto ha = a->make_handle(io.get_executor());
  auto hb = b->make_handle(io.get_executor());
  ASSERT_TRUE(wait_reachable(io, *a));
  ASSERT_TRUE(wait_reachable(io, *b));
  EXPECT_TRUE(await_on(io, ha->put("c", "{}", 60s)));
  EXPECT_EQ(redis->cli("EXISTS tenant-a:conv:c"), "1");
  EXPECT_EQ(await_on(io, hb->take("c")).kind, TakeResult::Kind::miss);
  EXPECT_EQ(await_on(io, ha->take("c")).kind, TakeResult::Kind::hit);
}

// Many concurrent takes of one entry, pipelined on each of two connections
// on two threads (two replicas' workers): exactly one hit.
TEST_F(RedisStore, ConcurrentTakesOneHit) {
  auto stores = make_stores();
  net::io_context io1, io2;
  auto h1 = stores->make_handle(io1.get_executor());
  auto h2 = stores->make_handle(io2.get_executor());
  for (int round = 0; round < 5; ++round) {
    ASSERT_TRUE(wait_reachable(io1, *stores));
    ASSERT_TRUE(await_on(io1, h1->put("shared", "{\"round\":" + std::to_string(round) + "}", 60s)));
    auto burst = [](net::io_context& io, ConversationStore& h) {
      std::vector<std::future<TakeResult>> futs;
      for (int i = 0; i < 8; ++i)
        futs.push_back(net::co_spawn(io, h.take("shared"), net::use_future));
      int hits = 0, errors = 0;
      for (auto& f : futs) {
        while (f.wait_for(0s) != std::future_status::ready)
          io.run_one_for(5ms);
        auto r = f.get();
        hits += r.kind == TakeResult::Kind::hit;
        errors += r.kind == TakeResult::Kind::error;
      }
      return std::pair{hits, errors};
    };
    // Make sure the second connection is up before racing.
    while (!await_on(io2, h2->put("warm", "{}", 60s))) {
    }
    auto f1 = std::async(std::launch::async, [&] { return burst(io1, *h1); });
    auto f2 = std::async(std::launch::async, [&] { return burst(io2, *h2); });
    auto [hits1, err1] = f1.get();
    auto [hits2, err2] = f2.get();
    EXPECT_EQ(err1 + err2, 0);
    EXPECT_EQ(hits1 + hits2, 1) << "round " << round;
  }
}

// An entry idle past its TTL is gone: the take misses.
TEST_F(RedisStore, TtlExpiry) {
  auto stores = make_stores();
  net::io_context io;
  auto h = stores->make_handle(io.get_executor());
  ASSERT_TRUE(wait_reachable(io, *stores));
  ASSERT_TRUE(await_on(io, h->put("short", "{}", 1s)));
  std::this_thread::sleep_for(1200ms);
  EXPECT_EQ(await_on(io, h->take("short")).kind, TakeResult::Kind::miss);
}

// Redis killed: takes and puts fail fast (errors, no hang), the counters
// rise and health says unreachable; restarted on the same port, the same
// handle works again.
TEST_F(RedisStore, KilledThenRestarted) {
  auto stores = make_stores();
  net::io_context io;
  auto h = stores->make_handle(io.get_executor());
  ASSERT_TRUE(wait_reachable(io, *stores));
  redis->kill();
  for (int i = 0; i < 20; ++i) {
    const auto t0 = Clock::now();
    auto r = await_on(io, h->take("c"));
    EXPECT_EQ(r.kind, TakeResult::Kind::error);
    EXPECT_LT(Clock::now() - t0, 200ms);
    EXPECT_FALSE(await_on(io, h->put("c", "{}", 60s)));
  }
  EXPECT_GE(stores->counters().errors.load(), 40u);
  EXPECT_FALSE(stores->health().reachable);

  redis->restart();
  ASSERT_TRUE(wait_reachable(io, *stores, 5s));
  EXPECT_TRUE(await_on(io, h->put("c", "{\"back\":true}", 60s)));
  auto r = await_on(io, h->take("c"));
  EXPECT_EQ(r.kind, TakeResult::Kind::hit);
  EXPECT_EQ(r.params, "{\"back\":true}");
}

// A frozen Redis (accepts, never answers): each take gives up within the
// bounded wait; after thawing, the store answers again.
TEST_F(RedisStore, FrozenServerBoundedWait) {
  auto stores = make_stores();
  net::io_context io;
  auto h = stores->make_handle(io.get_executor());
  ASSERT_TRUE(wait_reachable(io, *stores));
  redis->freeze();
  for (int i = 0; i < 10; ++i) {
    const auto t0 = Clock::now();
    EXPECT_EQ(await_on(io, h->take("c")).kind, TakeResult::Kind::error);
    EXPECT_LT(Clock::now() - t0, 150ms);
  }
  redis->thaw();
  ASSERT_TRUE(eventually(
      [&] {
        io.run_for(20ms);
        return await_on(io, h->put("c", "{}", 60s));
      },
      10s));
  EXPECT_EQ(await_on(io, h->take("c")).kind, TakeResult::Kind::hit);
}

// Nothing listens at the URL: the store starts anyway, every take is an
// error, health reports unreachable.
TEST_F(RedisStore, NothingListening) {
  auto stores = make_stores("redis://127.0.0.1:" + std::to_string(closed_port()));
  net::io_context io;
  auto h = stores->make_handle(io.get_executor());
  io.run_for(100ms);
  EXPECT_EQ(await_on(io, h->take("c")).kind, TakeResult::Kind::error);
  EXPECT_FALSE(stores->health().reachable);
}

// A store on `url`, once reachable, puts conversation "c", runs
// `check_key` (redis-cli's view of the key), then takes "c" back.
template <typename Check>
void put_check_take(const std::string& url, Check check_key) {
  ConversationStoreOptions o;
  o.redis_url = url;
  auto stores = make_conversation_stores(o);
  ASSERT_TRUE(stores) << stores.error();
  net::io_context io;
  auto h = (*stores)->make_handle(io.get_executor());
  ASSERT_TRUE(eventually([&] {
    io.run_for(10ms);
    return (*stores)->health().reachable;
  }));
  EXPECT_TRUE(await_on(io, h->put("c", "{}", 60s)));
  check_key();
  EXPECT_EQ(await_on(io, h->take("c")).kind, TakeResult::Kind::hit);
}

// A password-protected server on a unix socket, database 2: AUTH and
// SELECT run on connect, keys land in that database.
TEST(RedisStoreAuth, UnixSocketPasswordAndDb) {
  const std::string sock = "/tmp/pdgate-redis-" + std::to_string(getpid()) + ".sock";
  RedisServer redis({"--requirepass", "s3cret", "--unixsocket", sock, "--unixsocketperm", "700"});
  put_check_take("unix://" + sock + "?db=2&password=s3cret", [&] {
    EXPECT_EQ(redis.cli("-a s3cret --no-auth-warning -n 2 EXISTS pdgate:conv:c"), "1");
    EXPECT_EQ(redis.cli("-a s3cret --no-auth-warning -n 0 EXISTS pdgate:conv:c"), "0");
  });
}

// A password holding '@', ':' and '/', percent-encoded in the URL, reaches
// Redis decoded, over IPv6 loopback: AUTH and SELECT succeed and the key
// lands in database 1.
TEST(RedisStoreAuth, PercentEncodedPasswordOverIpv6) {
  if (!have_ipv6_loopback())
    GTEST_SKIP() << "no IPv6 loopback on this machine";
  RedisServer redis({"--requirepass", "p@ss:w/rd", "--bind", "127.0.0.1", "::1"});
  put_check_take("redis://:p%40ss%3Aw%2Frd@[::1]:" + std::to_string(redis.port()) + "/1", [&] {
    EXPECT_EQ(redis.cli("-a 'p@ss:w/rd' --no-auth-warning -n 1 EXISTS pdgate:conv:c"), "1");
  });
}

// A wrong password never becomes reachable; takes are errors, not hangs.
TEST(RedisStoreAuth, WrongPassword) {
  RedisServer redis({"--requirepass", "right"});
  ConversationStoreOptions o;
  o.redis_url = "redis://:wrong@127.0.0.1:" + std::to_string(redis.port());
  auto stores = make_conversation_stores(o);
  ASSERT_TRUE(stores);
  net::io_context io;
  auto h = (*stores)->make_handle(io.get_executor());
  io.run_for(300ms);
  EXPECT_FALSE((*stores)->health().reachable);
  EXPECT_EQ(await_on(io, h->take("c")).kind, TakeResult::Kind::error);
}

// Drives `io` until `pred` holds (the reconnect loop never lets run()
// return by itself).
template <typename Pred>
bool run_until(net::io_context& io, Pred pred, std::chrono::milliseconds limit = 5s) {
  const auto deadline = Clock::now() + limit;
  while (!pred() && Clock::now() < deadline)
    io.run_one_for(10ms);
  return pred();
}

RedisConnectionSettings settings_for(const RedisServer& redis) {
  RedisConnectionSettings s;
  auto ep = parse_redis_url(redis.url());
  EXPECT_TRUE(ep) << ep.error();
  s.endpoint = *ep;
  s.command_timeout = 500ms;
  s.reconnect_min = 50ms;
  s.reconnect_max = 200ms;
  return s;
}

// Array replies keep their elements (nested ones too).
TEST(RedisConnectionReplies, ArrayElements) {
  RedisServer redis;
  net::io_context io;
  RedisConnectionsShared shared;
  auto conn = RedisConnection::create(io.get_executor(), settings_for(redis), shared);
  conn->start();
  ASSERT_TRUE(run_until(io, [&] { return conn->ready(); }));
  const std::string rpush = "RPUSH", key = "list", a = "a", b = "bee";
  std::vector<std::string_view> push = {rpush, key, a, b};
  EXPECT_EQ(await_on(io, conn->command(std::move(push))).integer, 2);
  const std::string lrange = "LRANGE", from = "0", to = "-1";
  std::vector<std::string_view> range = {lrange, key, from, to};
  const RedisReply r = await_on(io, conn->command(std::move(range)));
  ASSERT_EQ(r.type, RedisReply::Type::array);
  ASSERT_EQ(r.elements.size(), 2u);
  EXPECT_EQ(r.elements[0].text, "a");
  EXPECT_EQ(r.elements[1].text, "bee");
  const std::string eval = "EVAL", script = "return {1, {'x', 2}}", nkeys = "0";
  std::vector<std::string_view> nested = {eval, script, nkeys};
  const RedisReply n = await_on(io, conn->command(std::move(nested)));
  ASSERT_EQ(n.type, RedisReply::Type::array);
  ASSERT_EQ(n.elements.size(), 2u);
  EXPECT_EQ(n.elements[0].integer, 1);
  ASSERT_EQ(n.elements[1].elements.size(), 2u);
  EXPECT_EQ(n.elements[1].elements[0].text, "x");
  EXPECT_EQ(n.elements[1].elements[1].integer, 2);
  conn->stop();
}

// A subscriber connection gets every message published on its channel,
// and after Redis restarts it subscribes again by itself: a message
// published then still arrives.
TEST(RedisSubscriber, MessagesAndResubscribeAfterRestart) {
  RedisServer redis;
  net::io_context io;
  RedisConnectionsShared shared;
  auto sub = RedisConnection::create(io.get_executor(), settings_for(redis), shared);
  std::vector<std::string> got;
  int subscribed = 0;
  sub->subscribe(
      "pdgate:test:chan", [&](std::string_view m) { got.emplace_back(m); }, [&] { ++subscribed; });
  sub->start();
  ASSERT_TRUE(run_until(io, [&] { return subscribed == 1; }));
  EXPECT_EQ(redis.cli("PUBLISH pdgate:test:chan hello"), "1");
  EXPECT_EQ(redis.cli("PUBLISH pdgate:test:other nobody"), "0");
  ASSERT_TRUE(run_until(io, [&] { return got.size() == 1; }));
  EXPECT_EQ(got[0], "hello");

  redis.restart();
  ASSERT_TRUE(run_until(io, [&] { return subscribed == 2; }));
  EXPECT_EQ(redis.cli("PUBLISH pdgate:test:chan again"), "1");
  ASSERT_TRUE(run_until(io, [&] { return got.size() == 2; }));
  EXPECT_EQ(got[1], "again");

  // After stop() nothing is delivered any more.
  sub->stop();
  io.run_for(100ms);
  EXPECT_EQ(redis.cli("PUBLISH pdgate:test:chan late"), "0");
  io.run_for(100ms);
  EXPECT_EQ(got.size(), 2u);
}

}  // namespace
}  // namespace pdgate::test
