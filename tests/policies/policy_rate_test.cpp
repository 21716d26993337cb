// The policies' rate primitives through a real gateway: pdgate.rate's
// sliding window, exact across worker threads; pdgate.kv_incr's TTL; and
// the admin API's listing of the shared store.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/integration/admin_gateway.hpp"
#include "tests/integration/harness.hpp"
#include "tests/plugins/redis_server.hpp"
#include "tests/policies/policy_gateway_util.hpp"

namespace pdgate::test {
namespace {

// 5 requests per tenant (x-tenant) in 10 s, refused with 429 and the
// window's Retry-After; `x-counter` requests count in a 1 s fixed window
// (kv_incr with a TTL), 3 at most.
constexpr const char* kLimits = R"lua(
return {
  on_request = function(req)
    local tenant = req.headers["x-tenant"] or "anonymous"
    if req.headers["x-counter"] then
      local n = pdgate.kv_incr("win:" .. tenant, 1, 1)
      if n > 3 then return 429, "window full", {["Retry-After"] = 1} end
      return
    end
    local ok, retry_after = pdgate.rate("rate:" .. tenant, 5, 10)
    if not ok then
      return 429, "tenant " .. tenant .. " over 5 requests in 10 s",
             {["Retry-After"] = retry_after}
    end
  end,
  pick = function(ctx, instances) return pdgate.least_loaded() end,
}
)lua";

// 24 requests of one tenant at once on 4 workers: exactly 5 reach the
// engine, the other 19 get 429 with a Retry-After within the window;
// another tenant has its own window. The admin API lists both windows'
// keys (bounded by ?limit, truncated said), values and TTLs.
TEST(PolicyRate, SlidingWindowIsExactAcrossWorkers) {
  Sim d("both", {"--itl-ms", "0"});
  Script policy(kLimits, "limits.lua");
  AdminGateway gw({"--model", "sim-model", "--workers", "4", "--kv-connector", "none", "--policy",
                   policy.path(), "--decode", d.hostport()});
  std::atomic<int> ok{0}, limited{0}, other{0};
  std::atomic<int> bad_retry_after{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 24; ++i) {
    clients.emplace_back([&] {
      auto r = post_json(gw.port(), "/v1/chat/completions", user_chat("x"), {{"x-tenant", "acme"}});
      if (r.status == 200) {
        ++ok;
      } else if (r.status == 429) {
        ++limited;
        const std::string ra = r.header("retry-after");
        if (ra.empty() || std::stoi(ra) < 1 || std::stoi(ra) > 10)
          ++bad_retry_after;
      } else {
        ++other;
      }
    });
  }
  for (auto& t : clients)
    t.join();
  EXPECT_EQ(ok, 5);
  EXPECT_EQ(limited, 19);
  EXPECT_EQ(other, 0);
  EXPECT_EQ(bad_retry_after, 0);
  EXPECT_EQ(d.requests().size(), 5u);
  EXPECT_EQ(
      post_json(gw.port(), "/v1/chat/completions", user_chat("x"), {{"x-tenant", "beta"}}).status,
      200);

  auto listing = gw.call("GET", "/admin/policy/kv?prefix=rate:");
  ASSERT_EQ(listing.status, 200) << listing.body;
  const Json j = listing.json();
  ASSERT_EQ(j["keys"].size(), 2u) << j;
  EXPECT_EQ(j["keys"][0]["key"], "rate:acme");
  EXPECT_EQ(j["keys"][0]["value"], 5);
  EXPECT_GT(j["keys"][0]["ttl_seconds"].get<double>(), 8);
  EXPECT_LE(j["keys"][0]["ttl_seconds"].get<double>(), 10);
  EXPECT_EQ(j["keys"][1]["key"], "rate:beta");
  EXPECT_EQ(j["matched"], 2);
  auto one = gw.call("GET", "/admin/policy/kv?prefix=rate:&limit=1").json();
  EXPECT_EQ(one["keys"].size(), 1u);
  EXPECT_EQ(one["truncated"], true);
  EXPECT_EQ(gw.call("GET", "/admin/policy/kv?limit=0").status, 400);
  EXPECT_EQ(gw.call("GET", "/admin/policy/kv?limit=100000").status, 400);
  EXPECT_EQ(gw.call("GET", "/admin/policy/kv", nullptr, {}).status, 401);
}

// kv_incr(key, 1, ttl) starts a window that expires on its own: 3
// requests pass, the 4th is refused, and once the second is over the
// count starts again.
TEST(PolicyRate, KvIncrWithTtlIsAFixedWindow) {
  Sim d("both", {"--itl-ms", "0"});
  Script policy(kLimits, "limits.lua");
  Gateway gw({"--model", "sim-model", "--workers", "2", "--kv-connector", "none", "--policy",
              policy.path(), "--decode", d.hostport()});
  const Headers h = {{"x-tenant", "acme"}, {"x-counter", "1"}};
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat("x"), h).status, 200) << i;
  auto refused = post_json(gw.port(), "/v1/chat/completions", user_chat("x"), h);
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_EQ(refused.header("retry-after"), "1");
  EXPECT_TRUE(eventually(
      [&] { return post_json(gw.port(), "/v1/chat/completions", user_chat("x"), h).status == 200; },
      std::chrono::seconds(3)));
}

// 3 requests per tenant (x-tenant) in 2 s, declared for the gateway to
// check after the hook (with --redis: for every replica).
constexpr const char* kDeclared = R"lua(
return {
  on_request = function(req)
    local tenant = req.headers["x-tenant"] or "anonymous"
    req:rate_limit("t:" .. tenant, 3, 2)
  end,
  pick = function(ctx, instances) return pdgate.least_loaded() end,
}
)lua";

// Sends `n` requests of `tenant`, alternating between `a` and `b`, and
// counts the answers: 200, 429 with a Retry-After of 1..2 s, other.
struct Tally {
  int ok = 0, limited = 0, other = 0, bad_retry_after = 0;
};
Tally alternate(std::uint16_t a, std::uint16_t b, const std::string& tenant, int n) {
  Tally t;
  for (int i = 0; i < n; ++i) {
    auto r = post_json(i % 2 == 0 ? a : b, "/v1/chat/completions", user_chat("x"),
                       {{"x-tenant", tenant}});
    if (r.status == 200) {
      ++t.ok;
    } else if (r.status == 429) {
      ++t.limited;
      const std::string ra = r.header("retry-after");
      if (ra.empty() || std::stoi(ra) < 1 || std::stoi(ra) > 2)
        ++t.bad_retry_after;
    } else {
      ++t.other;
    }
  }
  return t;
}

// Two replicas sharing Redis: a declared limit of 3 in 2 s lets exactly 3
// of alternating requests through; explain shows the full window, read
// from Redis, without counting; once the window passed, requests pass
// again. Redis frozen: a request waits no more than --redis-timeout.
// Redis killed: both replicas still serve, each judging alone (3 each),
// no request failing beyond the limit's 429s, the fallback counted.
TEST(PolicyRateLimit, ExactAcrossReplicasAndPerReplicaWithoutRedis) {
  RedisServer redis;
  Sim d("both", {"--itl-ms", "0"});
  Script policy(kDeclared, "declared.lua");
  const std::vector<std::string> args = {"--model",        "sim-model",  "--workers", "2",
                                         "--kv-connector", "none",       "--policy",  policy.path(),
                                         "--decode",       d.hostport(), "--redis",   redis.url()};
  AdminGateway gw1(args);
  Gateway gw2(args);
  for (std::uint16_t port : {gw1.port(), gw2.port()}) {
    ASSERT_TRUE(eventually([&] {
      return metric(port, "pdgate_redis_connected{role=\"rate_limits\"}") == 3;
    })) << get(port, "/metrics").body;
  }
  Tally t = alternate(gw1.port(), gw2.port(), "acme", 6);
  EXPECT_EQ(t.ok, 3);
  EXPECT_EQ(t.limited, 3);
  EXPECT_EQ(t.other, 0);
  EXPECT_EQ(t.bad_retry_after, 0);
  EXPECT_EQ(d.requests().size(), 3u);

  // Explain reads the window from Redis and counts nothing.
  const Json doc = {{"headers", {{"x-tenant", "acme"}}}, {"body", user_chat("x")}};
  for (int i = 0; i < 2; ++i) {
    auto r = gw1.call("POST", "/admin/policy/explain", doc);
    ASSERT_EQ(r.status, 200) << r.body;
    const Json e = r.json();
    ASSERT_EQ(e["hook"]["rate_limits"].size(), 1u) << e;
    const Json& l = e["hook"]["rate_limits"][0];
    EXPECT_EQ(l["key"], "t:acme");
    EXPECT_EQ(l["limit"], 3);
    EXPECT_EQ(l["allowed"], false) << l;
    EXPECT_EQ(l["count"], 3) << l;
    EXPECT_EQ(l["store"], "cluster") << l;
    EXPECT_EQ(e["answer"]["status"], 429) << e;
    EXPECT_EQ(e["answer"]["reject"], "request:limited") << e;
  }
  auto fresh = gw1.call("POST", "/admin/policy/explain",
                        Json{{"headers", {{"x-tenant", "fresh"}}}, {"body", user_chat("x")}});
  EXPECT_EQ(fresh.json()["hook"]["rate_limits"][0]["allowed"], true) << fresh.body;
  EXPECT_EQ(fresh.json()["hook"]["rate_limits"][0]["count"], 0) << fresh.body;
  EXPECT_EQ(fresh.json()["answer"]["routed"], true) << fresh.body;

  // After the window, the tenant's requests pass again.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  t = alternate(gw2.port(), gw1.port(), "acme", 4);
  EXPECT_EQ(t.ok, 3);
  EXPECT_EQ(t.limited, 1);

  // Redis frozen (accepts, never answers): a request waits at most
  // --redis-timeout for it, then this replica judges.
  redis.freeze();
  for (std::uint16_t port : {gw1.port(), gw2.port()}) {
    const auto start = std::chrono::steady_clock::now();
    auto r = post_json(port, "/v1/chat/completions", user_chat("x"), {{"x-tenant", "frozen"}});
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  }
  redis.thaw();

  // Redis gone: each replica judges alone, 3 each; nothing else fails.
  redis.kill();
  t = alternate(gw1.port(), gw2.port(), "beta", 8);
  EXPECT_EQ(t.ok, 6);
  EXPECT_EQ(t.limited, 2);
  EXPECT_EQ(t.other, 0);
  EXPECT_EQ(t.bad_retry_after, 0);
  for (std::uint16_t port : {gw1.port(), gw2.port()}) {
    EXPECT_GE(metric(port, "pdgate_policy_rate_limit_fallbacks_total{to=\"replica\"}"), 5);
    EXPECT_EQ(
        metric(port,
               "pdgate_policy_rate_limit_checks_total{store=\"replica\",outcome=\"limited\"}"),
        1);
  }
}

// /admin/config shows each stage's policy with its version (a hash of
// its text) and file time; a broken edit rejected by file polling shows
// there with its error and trigger (not only in the log), as a rejected
// POST /admin/policy/reload does, and is counted under the policy's name.
TEST(PolicyStatus, AdminConfigShowsVersionsAndRejectedReloads) {
  Sim d("both", {"--itl-ms", "0"});
  Script policy("return { pick = function(ctx, instances) return 1 end }", "mine.lua");
  AdminGateway gw({"--model", "sim-model", "--workers", "1", "--kv-connector", "none", "--policy",
                   policy.path(), "--policy-poll-interval", "100ms", "--decode", d.hostport()});
  const auto status = [&] { return gw.call("GET", "/admin/config").json()["policies"]; };
  Json s = status();
  ASSERT_TRUE(s.is_object()) << s;
  EXPECT_EQ(s["stages"]["decode"]["policy"], "mine");
  const std::string v1 = s["stages"]["decode"]["version"];
  EXPECT_EQ(v1.size(), 12u);
  EXPECT_TRUE(s["stages"]["decode"].contains("file_time")) << s;
  EXPECT_TRUE(s["last_reload_error"].is_null()) << s;

  policy.write("return { pick = function(ctx, instances) return 1 end");  // broken
  ASSERT_TRUE(eventually([&] { return !status()["last_reload_error"].is_null(); }));
  s = status();
  EXPECT_EQ(s["last_reload_error"]["trigger"], "file");
  EXPECT_EQ(s["last_reload_error"]["policy"], "mine");
  EXPECT_NE(s["last_reload_error"]["error"].get<std::string>().find("mine.lua"), std::string::npos);
  EXPECT_EQ(s["stages"]["decode"]["version"], v1);  // the running version stays
  EXPECT_EQ(metric(gw.port(), "pdgate_policy_reload_failures_total{policy=\"mine\"}"), 1);
  EXPECT_EQ(gw.call("POST", "/admin/policy/reload").status, 422);
  EXPECT_EQ(status()["last_reload_error"]["trigger"], "admin");

  policy.write("return { pick = function(ctx, instances) return nil end }");
  ASSERT_TRUE(eventually([&] { return status()["last_reload_error"].is_null(); }));
  EXPECT_NE(status()["stages"]["decode"]["version"], v1);
  EXPECT_EQ(metric(gw.port(), "pdgate_policy_reload_failures_total{policy=\"mine\"}"), 2);
}

}  // namespace
}  // namespace pdgate::test
