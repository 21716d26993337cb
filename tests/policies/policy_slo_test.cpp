// The tenant/SLO policy of docs/writing-a-policy.md (examples/slo/), as
// shipped and as the walkthrough shows it, through a real gateway in
// front of pdgate-sim engines: gold isolation, one hop for short prompts,
// prefix locality with its load guard, a per-tenant 429 with Retry-After,
// and a retry that stays in the tier after an engine's 500.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/integration/harness.hpp"
#include "tests/plugins/redis_server.hpp"
#include "tests/policies/policy_gateway_util.hpp"

namespace pdgate::test {
namespace {

// examples/slo/pdgate.yaml with its engines' addresses replaced by the
// sims' (in the file's order: two prefills, gold, gold, standard).
std::string slo_config(const std::vector<const Sim*>& sims) {
  std::string yaml = read_text(source_dir() + "/examples/slo/pdgate.yaml");
  const char* const from[] = {"127.0.0.1:8100", "127.0.0.1:8101", "127.0.0.1:8200",
                              "127.0.0.1:8201", "127.0.0.1:8202"};
  for (std::size_t i = 0; i < sims.size() && i < std::size(from); ++i) {
    const auto at = yaml.find(from[i]);
    EXPECT_NE(at, std::string::npos) << from[i];
    if (at != std::string::npos)
      yaml.replace(at, std::string(from[i]).size(), sims[i]->hostport());
  }
  return yaml;
}

Json long_chat(const std::string& seed) {
  std::string prompt;
  for (int i = 0; prompt.size() < 3000; ++i)
    prompt += seed + std::to_string(i) + " ";
  return user_chat(prompt);
}

TEST(PolicySlo, WalkthroughPolicyAsShipped) {
  const std::string policy = source_dir() + "/examples/slo/tenant_slo.lua";
  const std::string doc = read_text(source_dir() + "/docs/writing-a-policy.md");
  ASSERT_FALSE(doc.empty());
  EXPECT_NE(doc.find(read_text(policy)), std::string::npos)
      << "docs/writing-a-policy.md does not show examples/slo/tenant_slo.lua as it is";

  // Prefill answers take 1 s, so that concurrent prefills overlap.
  Sim p1("prefill", {"--prefill-base-ms", "1000"}), p2("prefill", {"--prefill-base-ms", "1000"});
  Sim bad_gold("decode", {"--error-rate", "1"}), gold("decode", {"--itl-ms", "0"}),
      standard("decode", {"--itl-ms", "0"});
  EditedFile config("pdgate.yaml", slo_config({&p1, &p2, &bad_gold, &gold, &standard}));
  const std::string log = ::testing::TempDir() + "/slo-" + std::to_string(::getpid()) + ".log";
  std::filesystem::remove(log);
  Gateway gw({"--config", config.path(), "--policy", policy, "--api-keys",
              source_dir() + "/examples/tenants/keys.yaml", "--workers", "1", "--access-log", log});
  const Headers acme = with_key("gold-tenant-key"), globex = with_key("standard-tenant-key"),
                initech = with_key("no-tier-key");

  // Gold: a long prompt twice (prefill, then decode), a short one twice
  // (one hop). Every decode on a gold instance; the failing one's 500 is
  // retried on the other gold instance, never on the standard one.
  const Json prompt = long_chat("acme");
  for (int i = 0; i < 2; ++i) {
    auto r = post_json(gw.port(), "/v1/chat/completions", prompt, acme);
    ASSERT_EQ(r.status, 200) << r.body;
  }
  const auto prefills = p1.requests().size() + p2.requests().size();
  EXPECT_GE(prefills, 2u);
  // Locality: the prompt's prefills (retries' too) all on one instance.
  EXPECT_EQ(p1.requests().size() * p2.requests().size(), 0u);
  for (int i = 0; i < 2; ++i) {
    auto r = post_json(gw.port(), "/v1/chat/completions", user_chat("short"), acme);
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(p1.requests().size() + p2.requests().size(), prefills);  // one hop
  EXPECT_EQ(gold.requests().size(), 4u);
  EXPECT_GE(bad_gold.requests().size(), 1u);
  EXPECT_EQ(standard.requests().size(), 0u);

  // The load guard: the home of a prompt takes it while its load is at
  // most 2x the least (+1); three at once, the third goes elsewhere.
  const Json other = long_chat("globex");
  ASSERT_EQ(post_json(gw.port(), "/v1/chat/completions", other, globex).status, 200);
  p1.clear();
  p2.clear();
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&] {
      EXPECT_EQ(post_json(gw.port(), "/v1/chat/completions", other, globex).status, 200);
    });
  }
  for (auto& t : clients)
    t.join();
  const auto a = p1.requests().size(), b = p2.requests().size();
  EXPECT_EQ(std::min(a, b), 1u) << a << " and " << b;
  EXPECT_EQ(std::max(a, b), 2u) << a << " and " << b;
  EXPECT_EQ(standard.requests().size(), 4u);

  // A tenant's sixth request in 10 s: 429 with Retry-After, no engine.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat("hi"), initech).status, 200)
        << i;
  }
  auto limited = post_json(gw.port(), "/v1/chat/completions", user_chat("hi"), initech);
  EXPECT_EQ(limited.status, 429) << limited.body;
  const int retry_after = std::stoi(
      limited.header("retry-after").empty() ? std::string("0") : limited.header("retry-after"));
  EXPECT_GE(retry_after, 1);
  EXPECT_LE(retry_after, 10);
  EXPECT_EQ(limited.json()["error"]["message"], "tenant initech is over 5 requests in 10 s");
  EXPECT_EQ(standard.requests().size(), 9u);
  EXPECT_EQ(gold.requests().size(), 4u);
  // The access log names the tenant, the path and the refusal.
  for (const char* line :
       {"status=429 stage=policy", "reject=request:limited tenant=initech path=-",
        "reject=- tenant=acme path=one_hop", "reject=- tenant=acme path=pd"}) {
    EXPECT_TRUE(eventually([&] { return read_text(log).find(line) != std::string::npos; }))
        << line << "\n"
        << read_text(log);
  }
  std::filesystem::remove(log);
}

// The SLO example's per-tenant limit (5 requests in 10 s) on two replicas
// sharing Redis, requests alternating between them: exactly 5 in all
// reach the engine, every later one gets 429 with a Retry-After within the
// window, on either replica (each replica counting alone let 5 through
// each: 10).
TEST(PolicySlo, RateLimitIsExactAcrossTwoReplicasWithRedis) {
  RedisServer redis;
  Sim p1("prefill"), p2("prefill"), gold1("decode"), gold2("decode"),
      standard("decode", {"--itl-ms", "0"});
  EditedFile config("pdgate.yaml", slo_config({&p1, &p2, &gold1, &gold2, &standard}));
  const std::vector<std::string> args = {
      "--config",   config.path(),
      "--policy",   source_dir() + "/examples/slo/tenant_slo.lua",
      "--api-keys", source_dir() + "/examples/tenants/keys.yaml",
      "--workers",  "2",
      "--redis",    redis.url()};
  Gateway gw1(args), gw2(args);
  const Headers initech = with_key("no-tier-key");
  // Every worker's Redis connections are up before the first request, so
  // that none is judged alone for want of a connection yet.
  for (Gateway* gw : {&gw1, &gw2}) {
    EXPECT_TRUE(eventually([&] {
      return metric(gw->port(), "pdgate_redis_connected{role=\"rate_limits\"}") == 3;
    })) << get(gw->port(), "/metrics").body;
  }
  int ok = 0, limited = 0;
  std::vector<int> statuses;
  for (int i = 0; i < 12; ++i) {
    Gateway& gw = i % 2 == 0 ? gw1 : gw2;
    auto r = post_json(gw.port(), "/v1/chat/completions", user_chat("hi"), initech);
    statuses.push_back(r.status);
    if (r.status == 200) {
      ++ok;
      continue;
    }
    ASSERT_EQ(r.status, 429) << i << ": " << r.body;
    ++limited;
    EXPECT_EQ(r.json()["error"]["message"], "tenant initech is over 5 requests in 10 s");
    const std::string ra = r.header("retry-after");
    ASSERT_FALSE(ra.empty()) << i;
    EXPECT_GE(std::stoi(ra), 1) << i;
    EXPECT_LE(std::stoi(ra), 10) << i;
  }
  EXPECT_EQ(ok, 5) << ::testing::PrintToString(statuses);
  EXPECT_EQ(limited, 7) << ::testing::PrintToString(statuses);
  // The first five passed; from the sixth (on gw2) both replicas refuse.
  EXPECT_EQ(statuses,
            (std::vector<int>{200, 200, 200, 200, 200, 429, 429, 429, 429, 429, 429, 429}));
  EXPECT_EQ(standard.requests().size(), 5u);
  // Both replicas counted their refusals as judged for the cluster.
  const std::string limited_series =
      "pdgate_policy_rate_limit_checks_total{store=\"cluster\",outcome=\"limited\"}";
  EXPECT_EQ(metric(gw1.port(), limited_series) + metric(gw2.port(), limited_series), 7);
}

}  // namespace
}  // namespace pdgate::test
