// The instance registry shared by gateway replicas through a real
// redis-server.
#include <gtest/gtest.h>

#include "tests/integration/harness.hpp"
#include "tests/plugins/redis_server.hpp"

namespace pdgate::test {
namespace {

const std::string kKey = "shared-key";

Json chat() {
  return {{"model", "sim-model"},
          {"messages", {{{"role", "user"}, {"content", "hi"}}}},
          {"max_tokens", 2},
          {"stream", false}};
}

// Two replicas sharing `redis`; A's admin API listens on a_admin.
struct TwoReplicas {
  TwoReplicas(const Sim& p, const Sim& d, const RedisServer& redis)
      : args{"--prefill", p.hostport(), "--decode",     d.hostport(),
             "--redis",   redis.url(),  "--admin-port", "0"},
        a(args, {{"ADMIN_API_KEY", kKey}}),
        a_admin(a.process().wait_listening()),
        b(args, {{"ADMIN_API_KEY", kKey}}) {}
  std::vector<std::string> args;
  Gateway a;
  std::uint16_t a_admin;
  Gateway b;
};

// An instance added on replica A takes traffic through replica B within a second.
TEST(SharedRegistry, AddOnOneReplicaServesThroughTheOtherWithinASecond) {
  RedisServer redis;
  Sim p("prefill"), d("decode"), added("decode");
  TwoReplicas r2(p, d, redis);
  const auto& args = r2.args;
  const auto a_admin = r2.a_admin;
  Gateway& b = r2.b;
  auto r = http_request(a_admin, "POST", "/admin/instances",
                        Json{{"role", "decode"}, {"url", added.url()}}.dump(),
                        {{"X-API-Key", kKey}, {"Content-Type", "application/json"}});
  ASSERT_EQ(r.status, 201) << r.body;
  const auto t0 = Clock::now();
  ASSERT_TRUE(
      eventually([&] { return b.status()["decode_node_count"] == 2; }, std::chrono::seconds(1)));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1));
  for (int i = 0; i < 6; ++i)
    ASSERT_EQ(post_json(b.port(), "/v1/chat/completions", chat()).status, 200);
  EXPECT_FALSE(added.requests().empty());

  // A replica started later loads the set; a removal reaches the others.
  Gateway c(args, {{"ADMIN_API_KEY", kKey}});
  EXPECT_TRUE(
      eventually([&] { return c.status()["decode_node_count"] == 2; }, std::chrono::seconds(2)));
  int id = 0;
  const Json listed =
      http_request(a_admin, "GET", "/admin/instances", "", {{"X-API-Key", kKey}}).json();
  for (const auto& i : listed["instances"]) {
    if (i["url"] == added.url())
      id = i["id"];
  }
  ASSERT_NE(id, 0);
  ASSERT_EQ(http_request(a_admin, "DELETE", "/admin/instances/" + std::to_string(id), "",
                         {{"X-API-Key", kKey}})
                .status,
            202);
  EXPECT_TRUE(
      eventually([&] { return b.status()["decode_node_count"] == 1; }, std::chrono::seconds(1)));
  EXPECT_TRUE(
      eventually([&] { return c.status()["decode_node_count"] == 1; }, std::chrono::seconds(1)));
}

// With Redis gone, replicas keep serving with their last known set.
TEST(SharedRegistry, RedisDownKeepsLastKnownSet) {
  auto redis = std::make_unique<RedisServer>();
  Sim p("prefill"), d("decode");
  Gateway a({"--prefill", p.hostport(), "--decode", d.hostport(), "--redis", redis->url()});
  redis.reset();
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(post_json(a.port(), "/v1/chat/completions", chat()).status, 200);
  EXPECT_EQ(a.status()["decode_node_count"], 1);
}

Response admin(std::uint16_t port, const std::string& method, const std::string& target,
               const Json& body = nullptr) {
  return http_request(port, method, target, body.is_null() ? "" : body.dump(),
                      {{"X-API-Key", kKey}, {"Content-Type", "application/json"}});
}

int instance_id(std::uint16_t admin_port, const std::string& url) {
  const Json listed = admin(admin_port, "GET", "/admin/instances").json();
  for (const auto& i : listed["instances"]) {
    if (i["url"] == url)
      return i["id"];
  }
  return 0;
}

// Changes travel by pub/sub: each of several adds on A is live on B well
// within a second (the periodic safety check runs only every 2 s).
TEST(SharedRegistry, ChangesReachOtherReplicaByPubSub) {
  RedisServer redis;
  Sim p("prefill"), d("decode"), e1("decode"), e2("decode"), e3("decode");
  TwoReplicas r2(p, d, redis);
  const auto a_admin = r2.a_admin;
  Gateway& b = r2.b;
  int expected = 1;
  for (Sim* s : {&e1, &e2, &e3}) {
    ASSERT_EQ(
        admin(a_admin, "POST", "/admin/instances", {{"role", "decode"}, {"url", s->url()}}).status,
        201);
    ++expected;
    EXPECT_TRUE(eventually([&] { return b.status()["decode_node_count"] == expected; },
                           std::chrono::milliseconds(700)))
        << "add of " << s->url() << " not on B within 700 ms";
  }
}

// While Redis is down, changes made on a replica (an add, a drain) are
// kept there and serve traffic; once Redis is back (empty: restarted
// without persistence) they are written to it and reach the other replica.
TEST(SharedRegistry, ChangesMadeWhileRedisIsDownAreWrittenBack) {
  RedisServer redis;
  Sim p("prefill"), d("decode"), added("decode");
  TwoReplicas r2(p, d, redis);
  const auto& args = r2.args;
  const auto a_admin = r2.a_admin;
  Gateway &a = r2.a, &b = r2.b;
  // Both replicas have announced their set.
  ASSERT_TRUE(eventually([&] { return redis.cli("EXISTS pdgate:instances") == "1"; }));

  redis.kill();
  ASSERT_EQ(
      admin(a_admin, "POST", "/admin/instances", {{"role", "decode"}, {"url", added.url()}}).status,
      201);
  const int d_id = instance_id(a_admin, d.url());
  ASSERT_NE(d_id, 0) << admin(a_admin, "GET", "/admin/instances").body;
  ASSERT_EQ(admin(a_admin, "POST", "/admin/instances/" + std::to_string(d_id) + "/drain").status,
            200);
  // A serves with its changed set: every decode goes to the added one.
  const auto d_before = d.requests().size();
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(post_json(a.port(), "/v1/chat/completions", chat()).status, 200);
  EXPECT_EQ(added.requests().size(), 4u);
  EXPECT_EQ(d.requests().size(), d_before);
  EXPECT_EQ(a.status()["decode_nodes"], Json::array({added.hostport()}));
  // B cannot know yet.
  EXPECT_EQ(b.status()["decode_nodes"], Json::array({d.hostport()}));

  redis.restart();
  EXPECT_TRUE(
      eventually([&] { return b.status()["decode_nodes"] == Json::array({added.hostport()}); },
                 std::chrono::seconds(5)))
      << b.status().dump();
  const auto added_before = added.requests().size();
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(post_json(b.port(), "/v1/chat/completions", chat()).status, 200);
  EXPECT_EQ(added.requests().size(), added_before + 4);
  // And Redis holds the changes, for replicas started later.
  Gateway c(args, {{"ADMIN_API_KEY", kKey}});
  EXPECT_TRUE(
      eventually([&] { return c.status()["decode_nodes"] == Json::array({added.hostport()}); },
                 std::chrono::seconds(2)))
      << c.status().dump();
}

}  // namespace
}  // namespace pdgate::test
