// What a policy sees and decides when the gateway retries a failed engine
// call (docs/policies.md, "Retries"), and how it refuses a request
// ("Refusals"): through a real gateway in front of pdgate-sim engines.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/integration/harness.hpp"
#include "tests/policies/policy_gateway_util.hpp"

namespace pdgate::test {
namespace {

// Decode instances labelled by tier, combined P+D (one hop).
std::string tiers_yaml(const std::vector<std::pair<std::string, std::string>>& url_tier) {
  std::string y = "kv-connector: none\ndecode:\n";
  for (const auto& [url, tier] : url_tier)
    y += "  - url: " + url + "\n    labels: {tier: " + tier + "}\n";
  return y;
}

// Goes first to the instance the x-first header names; a retry stays in
// the failed instance's tier, and counts what it saw of the failure.
constexpr const char* kTierRetry = R"lua(
return {
  fail_closed = true,
  pick = function(ctx, instances)
    local tier = ctx.headers["x-tier"]
    if ctx.failed then
      tier = ctx.failed.labels.tier
      pdgate.count("retry_" .. (ctx.attempt or 1) .. "_" .. ctx.failed.kind)
      if ctx.failed.url == ctx.headers["x-first"] and ctx.failed.status == 500 then
        pdgate.count("failed_seen")
      end
    else
      pdgate.count("first_" .. (ctx.attempt or 1))
      for _, inst in ipairs(instances) do
        if inst.url == ctx.headers["x-first"] then return inst end
      end
    end
    for _, inst in ipairs(instances) do
      if inst.labels.tier == tier then return inst end
    end
    return nil
  end,
}
)lua";

std::string retry_counter(const std::string& name) {
  return "pdgate_policy_custom_total{policy=\"retry\",name=\"" + name + "\"}";
}

// An engine's 500: the retry pick is told the attempt (2) and what failed
// (its URL, kind status_500, status, labels), and keeps the request in
// the failed instance's tier: the other gold instance answers, the
// standard one sees nothing.
TEST(PolicyRetry, RetryPickSeesTheFailureAndStaysInTheTier) {
  Sim bad("both", {"--error-rate", "1"}), gold("both", {"--itl-ms", "0"}),
      standard("both", {"--itl-ms", "0"});
  EditedFile config(
      "pdgate.yaml",
      tiers_yaml({{bad.url(), "gold"}, {standard.url(), "standard"}, {gold.url(), "gold"}}));
  Script policy(kTierRetry, "retry.lua");
  Gateway gw({"--config", config.path(), "--policy", policy.path(), "--workers", "1"});
  auto r = post_json(gw.port(), "/v1/chat/completions", user_chat("x"),
                     {{"x-tier", "gold"}, {"x-first", bad.url()}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(bad.requests().size(), 1u);
  EXPECT_EQ(gold.requests().size(), 1u);
  EXPECT_EQ(standard.requests().size(), 0u);
  EXPECT_EQ(metric(gw.port(), retry_counter("first_1")), 1);
  EXPECT_EQ(metric(gw.port(), retry_counter("retry_2_status_500")), 1);
  EXPECT_EQ(metric(gw.port(), retry_counter("failed_seen")), 1);
}

// The tier's only instance answers 500 and the policy has nowhere else
// to send the retry (nil, fail-closed): the client gets the engine's
// failure (502, the engine's status in the message), not a 503 that says
// the policy failed; the standard instance sees nothing.
TEST(PolicyRetry, RetryRefusedKeepsTheEnginesError) {
  Sim bad("both", {"--error-rate", "1"}), standard("both", {"--itl-ms", "0"});
  EditedFile config("pdgate.yaml", tiers_yaml({{bad.url(), "gold"}, {standard.url(), "standard"}}));
  Script policy(kTierRetry, "retry.lua");
  Gateway gw({"--config", config.path(), "--policy", policy.path(), "--workers", "1",
              "--verbose-errors", "true"});
  auto r = post_json(gw.port(), "/v1/chat/completions", user_chat("x"),
                     {{"x-tier", "gold"}, {"x-first", bad.url()}});
  EXPECT_EQ(r.status, 502) << r.body;
  const std::string message = r.json()["error"]["message"];
  EXPECT_NE(message.find("500"), std::string::npos) << message;
  EXPECT_NE(message.find("Simulated engine failure"), std::string::npos) << message;
  EXPECT_EQ(message.find("policy"), std::string::npos) << message;
  EXPECT_EQ(standard.requests().size(), 0u);
  EXPECT_EQ(metric(gw.port(), retry_counter("retry_2_status_500")), 1);
}

// --- Refusals ---------------------------------------------------------------------

// Refuses as the x-mode header says: in the hook or the pick, with a
// status, a message and headers (some out of bounds), declines, or fails.
std::string refusing_policy(bool fail_closed) {
  return std::string("return { fail_closed = ") + (fail_closed ? "true" : "false") + R"lua(,
  on_request = function(req)
    if req.headers["x-mode"] == "hook" then
      return 429, "slow down", {["Retry-After"] = 7, ["x-quota"] = "gold",
                                ["Set-Cookie"] = "no", ["x-pdgate-forged"] = "no"}
    end
  end,
  pick = function(ctx, instances)
    local m = ctx.headers["x-mode"]
    if m == "pick" then return nil, 429, "tenant over quota", {["Retry-After"] = "3"} end
    if m == "nil" then return nil end
    if m == "error" then error("broken on purpose") end
    return 1
  end,
}
)lua";
}

struct RefusalCase {
  const char* mode;
  int status;
  const char* message_part;
  const char* reject;  // the access log's reject field
};

std::string calls(const std::string& where, const std::string& outcome) {
  return "pdgate_policy_calls_total{policy=\"refuse\",stage=\"" + where + "\",outcome=\"" +
         outcome + "\"}";
}

// A hook's or a pick's refusal answers the client with the policy's
// status, message and its Retry-After and x-* headers (others dropped),
// whether or not the policy is fail-closed; a deliberate nil from a
// fail-closed pick is reported as declined (message, access log, metric)
// and a failure as failed; neither reaches an engine. The access log
// names the stage "policy" and the reason.
TEST(PolicyRefusal, StatusHeadersAndReasonReachClientLogAndMetrics) {
  Sim d("both", {"--itl-ms", "0"});
  for (const bool closed : {false, true}) {
    SCOPED_TRACE(closed ? "fail-closed" : "fail-open");
    const std::string log = ::testing::TempDir() + "/refusal-" + std::to_string(::getpid()) +
                            (closed ? "-closed" : "-open") + ".log";
    std::filesystem::remove(log);
    Script policy(refusing_policy(closed), "refuse.lua");
    Gateway gw({"--model", "sim-model", "--workers", "1", "--kv-connector", "none", "--policy",
                policy.path(), "--decode", d.hostport(), "--access-log", log});
    d.clear();
    std::vector<RefusalCase> cases = {{"pick", 429, "tenant over quota", "decode:rejected"},
                                      {"hook", 429, "slow down", "request:rejected"}};
    if (closed) {
      cases.push_back({"nil", 503, "declined", "decode:declined"});
      cases.push_back({"error", 503, "failed", "decode:error"});
    }
    for (const auto& c : cases) {
      auto r = post_json(gw.port(), "/v1/chat/completions", user_chat("x"), {{"x-mode", c.mode}});
      EXPECT_EQ(r.status, c.status) << c.mode << ": " << r.body;
      const std::string message = r.json()["error"]["message"];
      EXPECT_NE(message.find(c.message_part), std::string::npos) << c.mode << ": " << message;
    }
    auto pick = post_json(gw.port(), "/v1/chat/completions", user_chat("x"), {{"x-mode", "pick"}});
    EXPECT_EQ(pick.header("retry-after"), "3");
    EXPECT_EQ(pick.json()["error"]["type"], "RateLimitError");
    auto hook = post_json(gw.port(), "/v1/chat/completions", user_chat("x"), {{"x-mode", "hook"}});
    EXPECT_EQ(hook.header("retry-after"), "7");
    EXPECT_EQ(hook.header("x-quota"), "gold");
    EXPECT_EQ(hook.header("set-cookie"), "");
    EXPECT_EQ(hook.header("x-pdgate-forged"), "");
    EXPECT_EQ(d.requests().size(), 0u);
    // A fail-open policy's nil is routed round-robin.
    if (!closed) {
      EXPECT_EQ(
          post_json(gw.port(), "/v1/chat/completions", user_chat("x"), {{"x-mode", "nil"}}).status,
          200);
    }

    EXPECT_EQ(metric(gw.port(), calls("decode", "rejected")), 2);
    EXPECT_EQ(metric(gw.port(), calls("request", "rejected")), 2);
    EXPECT_EQ(metric(gw.port(), calls("decode", "declined")), 1);
    EXPECT_EQ(metric(gw.port(), "pdgate_policy_errors_total{kind=\"error\"}"), closed ? 1 : 0);
    for (const auto& c : cases) {
      EXPECT_TRUE(eventually([&] {
        const std::string text = read_text(log);
        return text.find(" status=" + std::to_string(c.status) + " stage=policy ") !=
                   std::string::npos &&
               text.find(" reject=" + std::string(c.reject)) != std::string::npos;
      })) << c.mode
          << ":\n"
          << read_text(log);
    }
    std::filesystem::remove(log);
  }
}

}  // namespace
}  // namespace pdgate::test
