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

// An instance added on replica A takes traffic through replica B within a second.
TEST(SharedRegistry, AddOnOneReplicaServesThroughTheOtherWithinASecond) {
  RedisServer redis;
  Sim p("prefill"), d("decode"), added("decode");
  const std::vector<std::string> args = {"--prefill", p.hostport(), "--decode",     d.hostport(),
                                         "--redis",   redis.url(),  "--admin-port", "0"};
  Gateway a(args, {{"ADMIN_API_KEY", kKey}});
  const auto a_admin = a.process().wait_listening();
  Gateway b(args, {{"ADMIN_API_KEY", kKey}});
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

}  // namespace
}  // namespace pdgate::test
