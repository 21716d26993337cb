// The request hook and the per-policy counters inside the policy engine,
// without a gateway: what on_request reads and decides, how its failures
// and reloads behave, and the bounds of pdgate.count and pdgate.log.
#include <gtest/gtest.h>

#include "core/pipeline/client_key.hpp"
#include "core/routing/request_hook.hpp"
#include "policies/policy_counters.hpp"
#include "tests/policies/policy_test_util.hpp"

namespace pdgate::policy {
namespace {

using test::engine_for;
using test::TempScript;

// A chat request for the hook, its body kept alive with it.
struct HookRequest {
  explicit HookRequest(std::string body_text, const ClientKey* key = nullptr)
      : body(std::move(body_text)), index(*index_json_object(body)) {
    in.request_id = "r1";
    in.body = body;
    in.index = &index;
    in.is_chat = true;
    in.model = "m";
    in.prompt_bytes = 40;
    in.key = key;
  }
  std::string body;
  JsonObjectIndex index;
  RequestHookInput in;
};

// Body fields arrive as Lua values by JSON type (null, arrays, objects as
// nil), the key's labels and the message count are readable, and the
// script's return is the rejection it chose.
TEST(RequestHook, ReadsFieldsAndRejects) {
  TempScript s(R"lua(
    return {
      on_request = function(req)
        local b = req.body
        local got = table.concat({ type(b.user), type(b.max_tokens), type(b.stream),
                                   type(b.nothing), type(b.messages), type(b.meta),
                                   tostring(req.message_count), tostring(req.key.labels.tier),
                                   req.key.name }, ",")
        return 451, got
      end,
      pick = function(ctx, instances) return 1 end,
    })lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  ClientKey key;
  key.name = "acme";
  key.labels = {{"tier", "gold"}};
  HookRequest r(R"({"user":"u","max_tokens":7,"stream":false,"nothing":null,)"
                R"("messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}],)"
                R"("meta":{"a":1}})",
                &key);
  RequestDecision d;
  ASSERT_TRUE(p->on_request(r.in, d));
  EXPECT_EQ(d.reject_status, 451u);
  EXPECT_EQ(d.reject_message, "string,number,boolean,nil,nil,nil,2,gold,acme");
}

// A policy without on_request leaves the decision alone and says so.
TEST(RequestHook, AbsentHookDecidesNothing) {
  auto e = engine_for("least_load");
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  HookRequest r(R"({"max_tokens":7})");
  RequestDecision d;
  EXPECT_FALSE(p->on_request(r.in, d));
  EXPECT_EQ(d.reject_status, 0u);
}

// A reload's self-check runs on_request: a hook that fails on its
// synthetic request (here: more than 16 header edits) is refused with the
// reason.
TEST(RequestHook, SelfCheckRunsTheHook) {
  TempScript s(R"lua(
    return {
      on_request = function(req)
        req:cap_max_tokens(3)
        for i = 1, 17 do req:set_header("x-h" .. i, "v") end
      end,
      pick = function(ctx, instances) return 1 end,
    })lua");
  auto e = PolicyEngine::create(test::settings_for(s.path()));
  // The self-check runs on_request, which fails here: the script is refused.
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().find("self-check (on_request)"), std::string::npos) << e.error();
  EXPECT_NE(e.error().find("at most 16 header edits"), std::string::npos) << e.error();
}

// A hook that fails only on real traffic decides nothing (its earlier
// edits are dropped); fail-closed, the decision says so (the pipeline
// answers 503).
TEST(RequestHook, FailureOpenOrClosed) {
  for (const bool closed : {false, true}) {
    TempScript s(std::string("return { fail_closed = ") + (closed ? "true" : "false") + R"lua(,
      on_request = function(req)
        req:set_priority(1)
        if req.body.user == "boom" then error("boom") end
      end,
      pick = function(ctx, instances) return 1 end,
    })lua");
    auto e = engine_for(s.path());
    ASSERT_TRUE(e);
    auto p = e->make_picker(0);
    HookRequest r(R"({"user":"boom"})");
    RequestDecision d;
    ASSERT_TRUE(p->on_request(r.in, d));
    EXPECT_FALSE(d.priority);
    EXPECT_EQ(d.failed_closed, closed);
    EXPECT_EQ(e->policy_metrics().for_policy("policy").calls(kRequestHook, CallOutcome::error), 1u);
  }
}

// Bad arguments raise: a refused header, a cap below 1, an unknown path,
// a fail_closed that is not a boolean (at load).
TEST(RequestHook, BadArgumentsRaise) {
  for (const char* call : {R"(req:set_header("Host", "x"))", R"(req:cap_max_tokens(0))",
                           R"(req:set_path("sideways"))", R"(req:set_header("x-a", "b\nc"))"}) {
    TempScript s(std::string("return { on_request = function(req) if req.body.go then ") + call +
                 " end end, pick = function(ctx, instances) return 1 end }");
    auto e = engine_for(s.path());
    ASSERT_TRUE(e);
    auto p = e->make_picker(0);
    HookRequest r(R"({"go":true})");
    RequestDecision d;
    ASSERT_TRUE(p->on_request(r.in, d));
    EXPECT_EQ(e->policy_metrics().for_policy("policy").calls(kRequestHook, CallOutcome::error), 1u)
        << call;
  }
  TempScript s("return { fail_closed = 'yes', pick = function(ctx, instances) return 1 end }");
  auto e = PolicyEngine::create(test::settings_for(s.path()));
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().find("fail_closed must be true or false"), std::string::npos);
}

// req:rate_limit only declares: the decision carries each limit (window
// in ms, the message kept); nothing is counted in the shared store. Out of
// bounds (an empty or 201-byte key, a limit of 0 or 100001, a window of 0,
// a fifth limit) raises, and a failed hook declares nothing.
TEST(RequestHook, RateLimitsAreDeclaredAndBounded) {
  TempScript ok(R"lua(return {
    on_request = function(req)
      req:rate_limit("t:acme", 5, 10, "over 5 in 10 s")
      req:rate_limit("global", 100000, 0.5)
    end,
    pick = function(ctx, instances) return 1 end })lua");
  auto e = engine_for(ok.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  HookRequest r(R"({})");
  RequestDecision d;
  ASSERT_TRUE(p->on_request(r.in, d));
  ASSERT_EQ(d.rate_limits.size(), 2u);
  EXPECT_EQ(d.rate_limits[0].key, "t:acme");
  EXPECT_EQ(d.rate_limits[0].limit, 5);
  EXPECT_EQ(d.rate_limits[0].window_ms, 10000);
  EXPECT_EQ(d.rate_limits[0].message, "over 5 in 10 s");
  EXPECT_EQ(d.rate_limits[1].window_ms, 500);
  EXPECT_TRUE(d.rate_limits[1].message.empty());
  std::size_t matched = 0;
  (void)e->kv().list("", 10, 0, matched);
  EXPECT_EQ(matched, 0u);  // declared, not counted

  for (const char* call :
       {R"(req:rate_limit("", 1, 1))", R"(req:rate_limit(string.rep("k", 201), 1, 1))",
        R"(req:rate_limit("k", 0, 1))", R"(req:rate_limit("k", 100001, 1))",
        R"(req:rate_limit("k", 1.5, 1))", R"(req:rate_limit("k", 1, 0))",
        R"(for i = 1, 5 do req:rate_limit("k" .. i, 1, 1) end)"}) {
    TempScript s(std::string("return { on_request = function(req) if req.body.go then ") + call +
                 " end end, pick = function(ctx, instances) return 1 end }");
    auto bad = engine_for(s.path());
    ASSERT_TRUE(bad);
    auto bp = bad->make_picker(0);
    HookRequest go(R"({"go":true})");
    RequestDecision bd;
    ASSERT_TRUE(bp->on_request(go.in, bd));
    EXPECT_TRUE(bd.rate_limits.empty()) << call;
    EXPECT_EQ(bad->policy_metrics().for_policy("policy").calls(kRequestHook, CallOutcome::error),
              1u)
        << call;
  }
}

// The req handle is dead once the hook returned: a script that kept it
// gets an error, not another request's data.
TEST(RequestHook, HandleDiesWithTheCall) {
  TempScript s(R"lua(
    local kept
    return {
      on_request = function(req) kept = req end,
      pick = function(ctx, instances)
        if kept then local _ = kept.model end
        return 1
      end,
    })lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  HookRequest r(R"({})");
  RequestDecision d;
  ASSERT_TRUE(p->on_request(r.in, d));
  PickContext ctx;
  ctx.request_id = "r1";
  auto inst = test::fake_instances(2);
  p->pick(inst, ctx);
  EXPECT_EQ(e->stats().errors.load(), 1u);
}

// Counter names are validated and bounded per policy; the log bucket
// holds 20 lines and refills at 10 per second.
TEST(PolicyCounters, Bounds) {
  PolicyCounters c("p");
  EXPECT_TRUE(c.count("9lives", 1));
  EXPECT_TRUE(c.count("has space", 1));
  EXPECT_TRUE(c.count(std::string(65, 'a'), 1));
  for (int i = 0; i < 32; ++i)
    EXPECT_FALSE(c.count("n" + std::to_string(i), 1));
  EXPECT_TRUE(c.count("one_more", 1));
  EXPECT_FALSE(c.count("n0", 5));  // an existing name still counts
  const auto t0 = std::chrono::steady_clock::now();
  int written = 0;
  for (int i = 0; i < 50; ++i)
    written += c.may_log(t0) ? 1 : 0;
  EXPECT_EQ(written, 20);
  EXPECT_EQ(c.log_dropped(), 30u);
  EXPECT_TRUE(c.may_log(t0 + std::chrono::milliseconds(150)));
  EXPECT_FALSE(c.may_log(t0 + std::chrono::milliseconds(150)));
}

// More than 64 policies share the "other" series.
TEST(PolicyCounters, PoliciesBounded) {
  PolicyMetrics m;
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(m.for_policy("p" + std::to_string(i)).name(), "p" + std::to_string(i));
  EXPECT_EQ(m.for_policy("late").name(), "other");
  EXPECT_EQ(&m.for_policy("later"), &m.for_policy("late"));
  EXPECT_EQ(policy_label("/etc/pdgate/tiers.lua"), "tiers");
  EXPECT_EQ(policy_label("least_load"), "least_load");
}

}  // namespace
}  // namespace pdgate::policy
