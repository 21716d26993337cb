// Composing policies through a real gateway: ctx.vars from the request
// hook to every pick of the same request, shipped policies used as
// building blocks with require, and nested body fields read by the hook.
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

// The hook reads nested body fields (a message's content, the system
// prompt, the tools' names, a kind and a count) and answers them back in
// its refusal's message, which the client reads. Strings are cut at 256
// KiB; a path deeper than 16 steps is refused (the hook fails, and the
// request goes on as configured).
TEST(PolicyBody, NestedFieldsAreReadBoundedWhenAsked) {
  Sim d("both", {"--itl-ms", "0"});
  Script policy(R"lua(
return {
  on_request = function(req)
    if not req.headers["x-fields"] then return end
    if req.headers["x-deep"] then
      req:body_field("a", 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
      return 400, "a 17-step path was read"
    end
    local second = req:body_field("messages", 2, "content")
    local part, part_kind = req:body_field("messages", 3, "content", 1, "text")
    local n, kind = req:body_field("messages")
    local _, temp_kind = req:body_field("temperature")
    local missing = req:body_field("messages", 9, "content")
    local tools = req.tools or {}
    local sys = req.system_prompt or "none"
    return 400, table.concat({ #sys, sys:sub(1, 8), second, part, part_kind,
                               kind .. ":" .. n, temp_kind, tostring(missing),
                               table.concat(tools, ",") }, "|")
  end,
  pick = function(ctx, instances) return 1 end,
}
)lua",
                "fields.lua");
  // A budget that a loaded machine's copy of a 300 KiB prompt fits in.
  Gateway gw({"--model", "sim-model", "--workers", "1", "--kv-connector", "none", "--policy",
              policy.path(), "--policy-budget-us", "50000", "--decode", d.hostport()});
  const std::string system(300 * 1024, 's');
  const Json body = {
      {"model", "sim-model"},
      {"temperature", 0.5},
      {"messages",
       Json::array({{{"role", "system"}, {"content", system}},
                    {{"role", "user"}, {"content", "second message"}},
                    {{"role", "user"},
                     {"content", Json::array({{{"type", "text"}, {"text", "a part"}}})}}})},
      {"tools", Json::array({{{"type", "function"}, {"function", {{"name", "get_weather"}}}},
                             {{"type", "function"}, {"function", {{"name", "book"}}}}})}};
  auto r = post_json(gw.port(), "/v1/chat/completions", body, {{"x-fields", "1"}});
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.json()["error"]["message"].get<std::string>(),
            "262144|ssssssss|second message|a part|string|array:3|number|nil|get_weather,book")
      << gw.process().log();
  // Too deep a path: the hook fails, the request is served as configured.
  auto deep = post_json(gw.port(), "/v1/chat/completions", user_chat("x"),
                        {{"x-fields", "1"}, {"x-deep", "1"}});
  EXPECT_EQ(deep.status, 200) << deep.body;
  EXPECT_TRUE(
      eventually([&] { return gw.process().log().find("1 to 16 steps") != std::string::npos; }));
}

}  // namespace
}  // namespace pdgate::test
