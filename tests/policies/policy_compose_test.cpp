// Composing policies through a real gateway: ctx.vars from the request
// hook to every pick of the same request, and shipped policies used as
// building blocks with require.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/integration/harness.hpp"
#include "tests/policies/policy_gateway_util.hpp"

namespace pdgate::test {
namespace {

// The hook names the tenant once in req.vars; each pick reads it and the
// count of picks before it in ctx.vars. Prefill goes through the shipped
// prefix_affinity, decode through least_load, both required; `os` is no
// shipped policy and cannot be required.
constexpr const char* kComposed = R"lua(
local pa = require "prefix_affinity"
local ll = require("least_load")
local refused = not pcall(require, "os")
return {
  on_request = function(req)
    req.vars.tenant = req.headers["x-tenant"]
    if refused then pdgate.count("require_os_refused") end
  end,
  pick = function(ctx, instances)
    local v = ctx.vars
    pdgate.count(ctx.stage .. "_" .. (v.tenant or "none") .. "_" .. (v.picks or 0))
    v.picks = (v.picks or 0) + 1
    if ctx.stage == "prefill" then return pa.pick(ctx, instances) end
    return ll.pick(ctx, instances)
  end,
}
)lua";

std::string composed_counter(const std::string& name) {
  return "pdgate_policy_custom_total{policy=\"composed\",name=\"" + name + "\"}";
}

// 8 requests at once on one worker, two tenants: each pick sees its own
// request's tenant and the prefill pick's mark (never another request's);
// then, one at a time, the same long prompt's prefills stay on one
// instance (prefix_affinity, required).
TEST(PolicyCompose, VarsReachEveryPickAndShippedPoliciesCompose) {
  Sim p1("prefill"), p2("prefill"), d1("decode", {"--itl-ms", "0"}),
      d2("decode", {"--itl-ms", "0"});
  Script policy(kComposed, "composed.lua");
  Gateway gw({"--model", "sim-model", "--workers", "1", "--policy", policy.path(), "--prefill",
              p1.hostport(), p2.hostport(), "--decode", d1.hostport(), d2.hostport()});
  const std::string prompt(4000, 'p');
  ASSERT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat(prompt), {{"x-tenant", "acme"}})
                .status,
            200);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      auto r = post_json(gw.port(), "/v1/chat/completions", user_chat(prompt),
                         {{"x-tenant", i % 2 == 0 ? "acme" : "beta"}});
      ok += r.status == 200 ? 1 : 0;
    });
  }
  for (auto& t : clients)
    t.join();
  EXPECT_EQ(ok, 8);
  EXPECT_EQ(metric(gw.port(), composed_counter("prefill_acme_0")), 5);
  EXPECT_EQ(metric(gw.port(), composed_counter("decode_acme_1")), 5);
  EXPECT_EQ(metric(gw.port(), composed_counter("prefill_beta_0")), 4);
  EXPECT_EQ(metric(gw.port(), composed_counter("decode_beta_1")), 4);
  EXPECT_EQ(metric(gw.port(), composed_counter("require_os_refused")), 9);
  // One at a time, the prompt's prefills stay where its blocks are.
  p1.clear();
  p2.clear();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(
        post_json(gw.port(), "/v1/chat/completions", user_chat(prompt), {{"x-tenant", "acme"}})
            .status,
        200);
  }
  EXPECT_EQ(p1.requests().size() * p2.requests().size(), 0u)
      << p1.requests().size() << " and " << p2.requests().size();
  EXPECT_EQ(p1.requests().size() + p2.requests().size(), 3u);
}

}  // namespace
}  // namespace pdgate::test
