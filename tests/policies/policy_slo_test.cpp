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
#include "tests/policies/policy_gateway_util.hpp"

namespace pdgate::test {
namespace {

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
  std::string yaml = read_text(source_dir() + "/examples/slo/pdgate.yaml");
  const std::pair<const char*, std::string> ports[] = {{"127.0.0.1:8100", p1.hostport()},
                                                       {"127.0.0.1:8101", p2.hostport()},
                                                       {"127.0.0.1:8200", bad_gold.hostport()},
                                                       {"127.0.0.1:8201", gold.hostport()},
                                                       {"127.0.0.1:8202", standard.hostport()}};
  for (const auto& [from, to] : ports) {
    const auto at = yaml.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    yaml.replace(at, std::string(from).size(), to);
  }
  EditedFile config("pdgate.yaml", yaml);
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
       {"status=429 stage=policy", "reject=request:rejected tenant=initech path=-",
        "reject=- tenant=acme path=one_hop", "reject=- tenant=acme path=pd"}) {
    EXPECT_TRUE(eventually([&] { return read_text(log).find(line) != std::string::npos; }))
        << line << "\n"
        << read_text(log);
  }
  std::filesystem::remove(log);
}

}  // namespace
}  // namespace pdgate::test
