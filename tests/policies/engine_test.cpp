// The Lua engine: loading, the sandbox, limits, fallbacks, reloads, and
// the C++ pieces policies rely on (prefix hashes, shared state, metrics).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "policies/engine.hpp"
#include "policies/metrics.hpp"
#include "policies/prefix_hash.hpp"
#include "tests/policies/policy_test_util.hpp"

namespace pdgate::policy {
namespace {

using test::engine_for;
using test::fake_instances;
using test::settings_for;
using test::TempScript;

PickContext decode_ctx(std::string_view request_id = "r1") {
  PickContext c;
  c.stage = Stage::decode;
  c.model = "m";
  c.request_id = request_id;
  return c;
}

// --- Loading --------------------------------------------------------------

// Every shipped policy loads and passes its self-check.
TEST(PolicyLoad, ShippedPoliciesLoad) {
  ASSERT_GE(shipped_policies().size(), 6u);
  for (const auto& p : shipped_policies()) {
    auto e = PolicyEngine::create(settings_for(p.name));
    EXPECT_TRUE(e.ok()) << p.name << ": " << (e.ok() ? "" : e.error());
  }
}

// An unknown name is rejected with the list of shipped names.
TEST(PolicyLoad, UnknownNameListsShipped) {
  auto e = PolicyEngine::create(settings_for("nope"));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("unknown policy 'nope'"), std::string::npos) << e.error();
  EXPECT_NE(e.error().find("least_load"), std::string::npos) << e.error();
}

// A syntax error names the file and line.
TEST(PolicyLoad, SyntaxErrorNamesFile) {
  TempScript s("return { pick = function(ctx, instances) return 1 end");
  auto e = PolicyEngine::create(settings_for(s.path()));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find(s.path()), std::string::npos) << e.error();
}

// A script that returns no pick function is rejected.
TEST(PolicyLoad, MissingPickRejected) {
  TempScript s("return { on_complete = function() end }");
  auto e = PolicyEngine::create(settings_for(s.path()));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("no pick function"), std::string::npos) << e.error();
}

// A script whose pick errors on the synthetic request fails the self-check.
TEST(PolicyLoad, SelfCheckCatchesRuntimeError) {
  TempScript s("return { pick = function(ctx, instances) return instances[1].nothing.x end }");
  auto e = PolicyEngine::create(settings_for(s.path()));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("self-check"), std::string::npos) << e.error();
}

// Precompiled bytecode is refused (mode "t").
TEST(PolicyLoad, BytecodeRefused) {
  TempScript s(std::string("\x1bLJ\x02garbage", 10));
  auto e = PolicyEngine::create(settings_for(s.path()));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("bytecode is not accepted"), std::string::npos) << e.error();
}

// --- Sandbox --------------------------------------------------------------

// Dangerous globals and functions are absent inside a policy; require
// loads the shipped policies only, never a library or a file.
TEST(PolicySandbox, DangerousGlobalsAbsent) {
  TempScript s(R"lua(
    for _, name in ipairs({ "os", "io", "debug", "ffi", "jit", "package", "/etc/passwd",
                            "./policy", "least_load.lua" }) do
      assert(not pcall(require, name), "require loads " .. name)
    end
    assert(type(require("least_load").pick) == "function", "require misses a shipped policy")
    local absent = { os == nil, io == nil, load == nil, loadstring == nil,
                     dofile == nil, loadfile == nil, debug == nil, jit == nil, ffi == nil,
                     package == nil, getfenv == nil, setfenv == nil, collectgarbage == nil,
                     string.dump == nil, ("x").dump == nil, module == nil, newproxy == nil }
    for i = 1, #absent do assert(absent[i], "global " .. i .. " is reachable") end
    return { pick = function(ctx, instances) return 1 end }
  )lua");
  auto e = PolicyEngine::create(settings_for(s.path()));
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error());
}

// Two stages naming different scripts do not share globals or libraries.
TEST(PolicySandbox, ScriptsIsolated) {
  TempScript a("math.max = nil; leaked = 1; return { pick = function() return 1 end }", "a");
  TempScript b(
      "assert(leaked == nil); assert(math.max ~= nil); "
      "return { pick = function() return 1 end }",
      "b");
  PolicySettings st;
  st.specs = {a.path(), b.path(), a.path()};
  auto e = PolicyEngine::create(st);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error());
}

// --- Picks and fallbacks --------------------------------------------------

// A pick may return the instance table or its position.
TEST(PolicyPick, TableOrIndex) {
  TempScript s(R"lua(
    return { pick = function(ctx, instances)
      if ctx.model == "by-index" then return 3 end
      return instances[2]
    end }
  )lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  auto ctx = decode_ctx();
  EXPECT_EQ(p->pick(inst, ctx), inst[1]);
  ctx.model = "by-index";
  EXPECT_EQ(p->pick(inst, ctx), inst[2]);
  EXPECT_EQ(e->stats().fallbacks(), 0u);
}

// The context carries the request's facts.
TEST(PolicyPick, ContextFields) {
  TempScript s(R"lua(
    return { pick = function(ctx, instances)
      if ctx.request_id == "self-check" then return 1 end
      assert(ctx.model == "llama", "model")
      assert(ctx.stream == true and ctx.is_chat == true, "flags")
      assert(ctx.prompt_len == 11, "prompt_len " .. tostring(ctx.prompt_len))
      assert(ctx.conversation_id == "c-7", "conversation_id")
      assert(ctx.request_id == "req-1", "request_id")
      assert(ctx.prefill == 9, "prefill " .. tostring(ctx.prefill))
      assert(ctx.headers["x-tenant"] == "blue", "header")
      local i = instances[1]
      assert(i.id == 1 and i.index == 1 and i.role == "decode" and i.weight == 1, "identity")
      assert(i.url == "http://10.0.0.1:8000", "url")
      assert(i.in_flight == 5 and i.healthy == true, "numbers")
      assert(i.cluster_in_flight == 7 and i.queued_tokens == 300, "cluster figures")
      assert(instances[2].cluster_in_flight == 0 and instances[2].queued_tokens == 0, "idle")
      assert(i.running == 6 and i.waiting == 2 and i.has_metrics == true, "metrics")
      assert(math.abs(i.kv_usage - 0.5) < 1e-9, "kv")
      assert(type(i.labels) == "table", "labels")
      assert(pdgate.load(i) == i.cluster_in_flight + i.other_load, "load with metrics")
      assert(i.other_load == 1, "other load " .. tostring(i.other_load))
      assert(pdgate.load(instances[2]) == instances[2].in_flight, "load without metrics")
      assert(pdgate.load({in_flight = 3, other_load = 7, has_metrics = false}) == 3, "stale")
      assert(pdgate.load({in_flight = 3, other_load = 7, has_metrics = true}) == 10, "fresh")
      return 2
    end }
  )lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(2);
  auto prefill = fake_instances(1, Role::prefill, 9);
  inst[0]->in_flight = 5;
  inst[0]->others_in_flight = 2;  // other replicas' (load sharing)
  inst[0]->queued_tokens = 100;
  inst[0]->others_queued_tokens = 200;
  // The engine holds 8: the 7 the replicas know of, and 1 from elsewhere.
  store_metrics(*inst[0], EngineMetrics{6.0, 2.0, 0.5}, steady_now_ms());
  PickContext ctx = decode_ctx("req-1");
  ctx.model = "llama";
  ctx.stream = true;
  ctx.is_chat = true;
  ctx.prompt_raw = "[{\"a\":\"b\"}]";
  ctx.conversation_id = "c-7";
  ctx.chosen_prefill = prefill[0].get();
  ctx.headers = {{"x-tenant", "blue"}};
  EXPECT_EQ(p->pick(inst, ctx), inst[1]);
  EXPECT_EQ(e->stats().fallbacks(), 0u);
}

// pdgate.RECHECK (docs/policies.md, "Waiting for the other replicas' picks"): with a wait to
// make (ctx.recheck_ms) the picker answers null and asks its caller to pick again; with none
// it asks the policy again at once; the second look (ctx.rechecked) must answer, and a second
// RECHECK is a bad answer (round-robin, or refused when fail-closed).
TEST(PolicyPick, RecheckAsksTheCallerOnlyWhenThereIsAWait) {
  TempScript s(R"lua(
    return { pick = function(ctx, instances)
      if ctx.recheck_ms > 0 then
        assert(ctx.recheck_ms == 30 and not ctx.rechecked, "recheck_ms " .. ctx.recheck_ms)
        return pdgate.RECHECK
      end
      if ctx.model == "stubborn" then return pdgate.RECHECK end
      if ctx.rechecked then return instances[2] end
      return instances[1]
    end }
  )lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(3, Role::prefill);
  PickContext ctx = decode_ctx();
  ctx.stage = Stage::prefill;
  const auto calls = [&](CallOutcome o) {
    return e->policy_metrics().for_policy("policy").calls(static_cast<int>(Stage::prefill), o);
  };
  // Nothing to wait for: answered at once, no recheck.
  EXPECT_EQ(p->pick(inst, ctx), inst[0]);
  EXPECT_FALSE(p->wants_recheck());
  // A wait to make: the caller is asked to make it.
  ctx.recheck_wait = std::chrono::milliseconds(30);
  EXPECT_EQ(p->pick(inst, ctx), nullptr);
  EXPECT_TRUE(p->wants_recheck());
  EXPECT_EQ(p->last_refusal(), nullptr);
  EXPECT_FALSE(p->failed_closed());
  EXPECT_EQ(calls(CallOutcome::recheck), 1u);
  // The second look.
  ctx.recheck_wait = std::chrono::milliseconds(0);
  ctx.rechecked = true;
  EXPECT_EQ(p->pick(inst, ctx), inst[1]);
  EXPECT_FALSE(p->wants_recheck());
  EXPECT_EQ(calls(CallOutcome::picked), 2u);
  // RECHECK where the caller cannot wait: asked again at once (ctx.rechecked), and RECHECK
  // again is invalid: round-robin picks.
  ctx.rechecked = false;
  ctx.model = "stubborn";
  EXPECT_NE(p->pick(inst, ctx), nullptr);
  EXPECT_FALSE(p->wants_recheck());
  EXPECT_EQ(calls(CallOutcome::recheck), 2u);
  EXPECT_EQ(calls(CallOutcome::error), 1u);
  EXPECT_EQ(e->stats().invalid.load(), 1u);
  EXPECT_EQ(e->stats().fallbacks(), 1u);
}

// Headers given as a source (what the gateway passes) are produced only
// when a script reads ctx.headers, once per pick, and reach it like the
// eager list.
TEST(PolicyPick, HeadersFromSourceOnlyWhenRead) {
  TempScript s(R"lua(
    return { pick = function(ctx, instances)
      if ctx.model == "ignore-headers" then return 1 end
      local h = ctx.headers
      assert(h == ctx.headers, "same table within a pick")
      if h["x-tenant"] == "blue" then return 2 end
      return 1
    end }
  )lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(2);
  struct Source {
    std::vector<std::pair<std::string, std::string>> headers;
    int listed = 0;
  } src;
  auto each = [](const void* source, void* user, PickContext::HeaderEmit emit) {
    auto* s = static_cast<Source*>(const_cast<void*>(source));
    ++s->listed;
    for (const auto& [k, v] : s->headers)
      emit(user, k, v);
  };
  PickContext ctx = decode_ctx("req-h");
  ctx.header_source = &src;
  ctx.for_each_header = each;

  ctx.model = "ignore-headers";
  EXPECT_EQ(p->pick(inst, ctx), inst[0]);
  EXPECT_EQ(src.listed, 0);

  ctx.model = "m";
  src.headers = {{"x-tenant", "blue"}};
  EXPECT_EQ(p->pick(inst, ctx), inst[1]);
  EXPECT_EQ(src.listed, 1);
  // The next pick sees the next request's headers, not the cached table.
  src.headers = {{"x-tenant", "red"}};
  EXPECT_EQ(p->pick(inst, ctx), inst[0]);
  EXPECT_EQ(src.listed, 2);
  src.headers.clear();
  EXPECT_EQ(p->pick(inst, ctx), inst[0]);
  EXPECT_EQ(e->stats().fallbacks(), 0u);
}

// Numbers that change between picks reach the script (cached tables stay fresh).
TEST(PolicyPick, NumbersRefreshBetweenPicks) {
  auto e = engine_for("least_load");
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(3);
  inst[0]->in_flight = 1;
  inst[1]->in_flight = 0;
  inst[2]->in_flight = 2;
  EXPECT_EQ(p->pick(inst, decode_ctx()), inst[1]);
  inst[1]->in_flight = 9;
  EXPECT_EQ(p->pick(inst, decode_ctx()), inst[0]);
  inst[1]->healthy = false;
  inst[1]->in_flight = 0;
  EXPECT_EQ(p->pick(inst, decode_ctx()), inst[0]);
}

// A runtime error falls back to round-robin and is counted.
TEST(PolicyPick, ErrorFallsBack) {
  TempScript s(R"lua(
    return { pick = function(ctx, instances)
      if ctx.model == "boom" then error("kaput") end
      return 1
    end }
  )lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(3);
  auto ctx = decode_ctx();
  ctx.model = "boom";
  std::set<InstancePtr> seen;
  for (int i = 0; i < 3; ++i)
    seen.insert(p->pick(inst, ctx));
  EXPECT_EQ(seen.size(), 3u);  // round-robin spreads
  EXPECT_EQ(e->stats().errors.load(), 3u);
}

// Out-of-range positions, foreign tables and strings are invalid answers.
TEST(PolicyPick, InvalidAnswersFallBack) {
  TempScript s(R"lua(
    return { pick = function(ctx, instances)
      if ctx.model == "zero" then return 0 end
      if ctx.model == "big" then return #instances + 1 end
      if ctx.model == "frac" then return 1.5 end
      if ctx.model == "copy" then return { index = 1 } end
      if ctx.model == "str" then return "x" end
      return 1
    end }
  )lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(2);
  for (const char* m : {"zero", "big", "frac", "copy", "str"}) {
    auto ctx = decode_ctx();
    ctx.model = m;
    EXPECT_NE(p->pick(inst, ctx), nullptr) << m;
  }
  EXPECT_EQ(e->stats().invalid.load(), 5u);
}

// nil declines: round-robin routes the request, and it is not an error.
TEST(PolicyPick, DeclineIsNotAnError) {
  TempScript s("return { pick = function() return nil end }");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(2);
  EXPECT_NE(p->pick(inst, decode_ctx()), nullptr);
  EXPECT_EQ(e->stats().declined.load(), 1u);
  EXPECT_EQ(e->stats().fallbacks(), 0u);
}

// An empty candidate list returns nullptr without running the script.
TEST(PolicyPick, NoCandidates) {
  auto e = engine_for("round_robin");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->make_picker(0)->pick({}, decode_ctx()), nullptr);
  EXPECT_EQ(e->stats().picks.load(), 0u);
}

// --- Limits ---------------------------------------------------------------

// An infinite loop is cut off at the budget; the next pick works again.
TEST(PolicyLimits, InfiniteLoopCutOff) {
  TempScript s(R"lua(
    return { pick = function(ctx, instances)
      if ctx.model == "spin" then while true do end end
      return 1
    end }
  )lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(2);
  auto ctx = decode_ctx();
  ctx.model = "spin";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(p->pick(inst, ctx), nullptr);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::milliseconds(50));
  EXPECT_EQ(e->stats().budget_exceeded.load(), 1u);
  EXPECT_EQ(p->pick(inst, decode_ctx()), inst[0]);
}

// A loop hot enough to be JIT-compiled elsewhere is still cut off here.
TEST(PolicyLimits, HotLoopCutOff) {
  TempScript s(R"lua(
    return { pick = function(ctx, instances)
      if ctx.model == "spin" then
        local x = 0
        for i = 1, 1e12 do x = x + i % 7 end
        return x
      end
      return 1
    end }
  )lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto ctx = decode_ctx();
  ctx.model = "spin";
  EXPECT_NE(p->pick(fake_instances(2), ctx), nullptr);
  EXPECT_EQ(e->stats().budget_exceeded.load(), 1u);
}

// pcall cannot swallow the budget error to keep looping.
TEST(PolicyLimits, PcallCannotSwallowBudget) {
  TempScript s(R"lua(
    return { pick = function(ctx, instances)
      if ctx.model == "spin" then
        while true do pcall(function() while true do end end) end
      end
      return 1
    end }
  )lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto ctx = decode_ctx();
  ctx.model = "spin";
  EXPECT_NE(p->pick(fake_instances(2), ctx), nullptr);
  EXPECT_EQ(e->stats().budget_exceeded.load(), 1u);
}

// Allocating past the memory cap fails the pick, not the process.
TEST(PolicyLimits, MemoryCap) {
  TempScript s(R"lua(
    local keep = {}
    return { pick = function(ctx, instances)
      if ctx.model == "hog" then
        for i = 1, 1e9 do keep[i] = string.rep("x", 4096) .. i end
      end
      return 1
    end }
  )lua");
  PolicySettings st = settings_for(s.path());
  st.memory_limit = 8u << 20;
  st.budget = std::chrono::seconds(5);  // let memory, not time, stop it
  auto e = PolicyEngine::create(st);
  ASSERT_TRUE(e.ok()) << e.error();
  auto p = (*e)->make_picker(0);
  auto ctx = decode_ctx();
  ctx.model = "hog";
  EXPECT_NE(p->pick(fake_instances(2), ctx), nullptr);
  EXPECT_EQ((*e)->stats().errors.load(), 1u);
}

// A runaway on_complete is cut off and counted too.
TEST(PolicyLimits, OnCompleteBudget) {
  TempScript s(R"lua(
    return { pick = function() return 1 end,
             on_complete = function(ctx) if ctx.model == "spin" then while true do end end end }
  )lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(1);
  auto ctx = decode_ctx();
  ctx.model = "spin";
  p->on_complete(*inst[0], ctx, PickOutcome{});
  EXPECT_EQ(e->stats().on_complete_errors.load(), 1u);
}

// --- on_complete and shared state -----------------------------------------

// on_complete sees the outcome; state it keeps is visible to later picks,
// and the shared store is visible to another worker's state.
TEST(PolicyHooks, OnCompleteAndSharedStore) {
  TempScript s(R"lua(
    local seen = 0
    return {
      pick = function(ctx, instances)
        if ctx.model == "read" then
          assert(pdgate.kv_get("last_status") == 503, "shared store")
          return seen
        end
        return 1
      end,
      on_complete = function(ctx, inst, outcome)
        if ctx.request_id == "self-check" then return end
        assert(outcome.ok == false and outcome.status == 503 and outcome.stage == "decode")
        assert(math.abs(outcome.ttft_ms - 2.5) < 1e-9 and outcome.total_ms == 4)
        assert(math.abs(outcome.header_ms - 1.5) < 1e-9)
        assert(outcome.ttfb_ms == outcome.ttft_ms, "ttfb_ms: the old name of ttft_ms")
        seen = inst.index
        assert(pdgate.kv_set("last_status", outcome.status))
      end,
    }
  )lua");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p0 = e->make_picker(0);
  auto p1 = e->make_picker(1);
  auto inst = fake_instances(3);
  auto ctx = decode_ctx();
  ASSERT_EQ(p0->pick(inst, ctx), inst[0]);
  PickOutcome o;
  o.stage = Stage::decode;
  o.status = 503;
  o.time_to_header = std::chrono::microseconds(1500);
  o.time_to_first_token = std::chrono::microseconds(2500);
  o.total = std::chrono::milliseconds(4);
  p0->on_complete(*inst[1], ctx, o);
  EXPECT_EQ(e->stats().on_complete_errors.load(), 0u);
  auto read = decode_ctx();
  read.model = "read";
  EXPECT_EQ(p0->pick(inst, read), inst[1]);  // worker 0 learned index 2
  EXPECT_EQ(e->stats().fallbacks(), 0u);
  // Worker 1 has its own state (seen == 0: invalid) but the same store.
  EXPECT_NE(p1->pick(inst, read), nullptr);
  EXPECT_EQ(e->stats().invalid.load(), 1u);
  EXPECT_EQ(e->stats().errors.load(), 0u);
}

// The shared store caps its size; a full store answers nil, err.
TEST(SharedState, KvStoreCap) {
  KvStore kv(1000);
  EXPECT_TRUE(kv.set("a", 1.0, 0, 0).ok());
  std::string big(2000, 'x');
  auto r = kv.set("b", big, 0, 0);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(std::get<double>(*kv.get("a", 0)), 1.0);
  EXPECT_EQ(*kv.incr("a", 2, 0), 3.0);
  EXPECT_TRUE(kv.set("t", true, 10, 100).ok());
  EXPECT_TRUE(kv.get("t", 105).has_value());
  EXPECT_FALSE(kv.get("t", 111).has_value());  // expired
}

// kv_incr's TTL is set with the key it creates, in the same step; a
// full store drops expired keys before refusing.
TEST(SharedState, IncrWithTtlAndSweep) {
  KvStore kv(1000);
  EXPECT_EQ(*kv.incr("w", 1, 0, 100), 1.0);
  EXPECT_EQ(*kv.incr("w", 1, 50, 100), 2.0);   // the first call's expiry stands
  EXPECT_EQ(*kv.incr("w", 1, 100, 100), 1.0);  // expired at 100: a new window
  KvStore full(1000);
  // 13 keys of ~75 bytes each (key, value, entry overhead).
  for (int i = 0; i < 13; ++i)
    EXPECT_TRUE(full.incr("k" + std::to_string(i), 1, 0, 10).ok()) << i;
  EXPECT_FALSE(full.incr("one-too-many", 1, 5).ok());
  EXPECT_TRUE(full.incr("after-expiry", 1, 10).ok());  // the expired keys went
}

// pdgate.rate: at most `limit` events in any `window`, the refusal saying
// when the oldest counted one leaves; the log is bounded by the limit.
TEST(SharedState, SlidingWindow) {
  KvStore kv;
  for (int t = 0; t < 3; ++t)
    EXPECT_TRUE(kv.rate("r", 3, 1000, t * 100)->allowed) << t;
  auto refused = *kv.rate("r", 3, 1000, 500);
  EXPECT_FALSE(refused.allowed);
  EXPECT_EQ(refused.count, 3);
  EXPECT_EQ(refused.retry_after_ms, 500);  // the event at 0 leaves at 1000
  EXPECT_FALSE(kv.rate("r", 3, 1000, 999)->allowed);
  EXPECT_TRUE(kv.rate("r", 3, 1000, 1000)->allowed);  // 0 left; 100, 200, 1000
  EXPECT_FALSE(kv.rate("r", 3, 1000, 1050)->allowed);
  for (int t = 0; t < 100000; t += 7)
    (void)kv.rate("busy", 5, 50, 2000 + t);
  EXPECT_LT(kv.bytes(), 4096u);
  EXPECT_FALSE(kv.rate("r", 0, 1000, 0).ok());
  EXPECT_FALSE(kv.rate("r", 1, 0, 0).ok());
  EXPECT_TRUE(kv.set("n", 1.0, 0, 0).ok());
  EXPECT_FALSE(kv.rate("n", 3, 1000, 0).ok());  // a value, not a rate log
  EXPECT_FALSE(kv.incr("r", 1, 1050).ok());     // a rate log, not a number
}

// A request's declared limits (req:rate_limit) judged together: counted
// under every key only when all fit; a dry check (explain) or a refusal
// counts nothing, and the counts say the window as it stands.
TEST(KvStoreRateAll, CountsUnderEveryKeyOnlyWhenAllFit) {
  KvStore kv;
  const KvStore::RateQuery both[] = {{"tenant", 3, 1000}, {"global", 2, 1000}};
  auto a = *kv.rate_all(both, 0, true);
  EXPECT_TRUE(a[0].allowed && a[1].allowed);
  EXPECT_EQ(a[0].count, 1);
  EXPECT_EQ(a[1].count, 1);
  auto dry = *kv.rate_all(both, 10, false);
  EXPECT_TRUE(dry[0].allowed && dry[1].allowed);
  EXPECT_EQ(dry[0].count, 1);  // as it stands: the dry check counted nothing
  EXPECT_TRUE(kv.rate_all(both, 100, true)->at(1).allowed);
  // "global" is full: refused, and "tenant" does not count this one.
  auto refused = *kv.rate_all(both, 200, true);
  EXPECT_TRUE(refused[0].allowed);
  EXPECT_FALSE(refused[1].allowed);
  EXPECT_EQ(refused[1].retry_after_ms, 800);  // the event at 0 leaves at 1000
  EXPECT_EQ(refused[0].count, 2);
  EXPECT_EQ(kv.rate_peek("tenant", 3, 1000, 200)->count, 3);  // 2 in, this one would be the 3rd
  // Once the first events left, both count again.
  auto later = *kv.rate_all(both, 1000, true);
  EXPECT_TRUE(later[0].allowed && later[1].allowed);
  const KvStore::RateQuery bad[] = {{"tenant", 0, 1000}};
  EXPECT_FALSE(kv.rate_all(bad, 0, true).ok());
  EXPECT_TRUE(kv.set("n", 1.0, 0, 0).ok());
  const KvStore::RateQuery value[] = {{"tenant", 3, 1000}, {"n", 3, 1000}};
  EXPECT_FALSE(kv.rate_all(value, 1000, true).ok());           // a value, not a rate log
  EXPECT_EQ(kv.rate_peek("tenant", 3, 1000, 1000)->count, 3);  // nothing counted
}

// The admin listing: by prefix, in key order, the first `max`, live only.
TEST(SharedState, Listing) {
  KvStore kv;
  for (int i = 9; i >= 0; --i)
    EXPECT_TRUE(kv.set("p:" + std::to_string(i), static_cast<double>(i), i == 0 ? 10 : 0, 0).ok());
  EXPECT_TRUE(kv.set("q", true, 0, 0).ok());
  std::size_t matched = 0;
  const auto rows = kv.list("p:", 3, 5, matched);
  EXPECT_EQ(matched, 10u);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].key, "p:0");
  EXPECT_EQ(rows[0].ttl_ms, 5);
  EXPECT_EQ(rows[2].key, "p:2");
  EXPECT_EQ(kv.list("p:", 3, 20, matched)[0].key, "p:1");  // p:0 expired
  EXPECT_EQ(matched, 9u);
  EXPECT_EQ(kv.list("", 100, 20, matched).size(), 10u);
}

// --- Reload ---------------------------------------------------------------

// A good reload switches every worker before its next pick.
TEST(PolicyReload, GoodReloadSwitches) {
  TempScript s("return { pick = function() return 1 end }");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(3);
  EXPECT_EQ(p->pick(inst, decode_ctx()), inst[0]);
  s.write("return { pick = function() return 3 end }");
  auto r = e->reload_if_changed();
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->ok()) << r->error();
  EXPECT_EQ(p->pick(inst, decode_ctx()), inst[2]);
  EXPECT_EQ(e->stats().reloads.load(), 1u);
  EXPECT_FALSE(e->reload_if_changed().has_value());  // unchanged: no reload
}

// A broken script is rejected with its error and the old version stays.
TEST(PolicyReload, BrokenReloadKeepsOld) {
  TempScript s("return { pick = function() return 2 end }");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(3);
  const auto gen = e->generation();
  for (const char* bad : {"return {", "return { pick = function() while true do end end }",
                          "return { pick = function() return 'x' end }", "return 42"}) {
    s.write(bad);
    auto r = e->reload();
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(e->generation(), gen);
    EXPECT_EQ(p->pick(inst, decode_ctx()), inst[1]) << bad;
  }
  EXPECT_EQ(e->stats().reload_failures.load(), 4u);
}

// A request whose prefill was picked by the old version gets its decode
// pick and its reports from that version too.
TEST(PolicyReload, InFlightRequestKeepsVersion) {
  TempScript s("return { pick = function() return 1 end }");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto prefills = fake_instances(2, Role::prefill, 10);
  auto decodes = fake_instances(2, Role::decode, 20);
  PickContext ctx = decode_ctx("in-flight");
  ctx.stage = Stage::prefill;
  ASSERT_EQ(p->pick(prefills, ctx), prefills[0]);
  PickOutcome ok;
  ok.ok = true;
  ok.stage = Stage::prefill;
  p->on_complete(*prefills[0], ctx, ok);
  s.write("return { pick = function() return 2 end }");
  ASSERT_TRUE(e->reload().ok());
  ctx.stage = Stage::decode;
  EXPECT_EQ(p->pick(decodes, ctx), decodes[0]);  // old version
  ok.stage = Stage::decode;
  p->on_complete(*decodes[0], ctx, ok);
  EXPECT_EQ(p->pick(decodes, decode_ctx("new")), decodes[1]);  // new version
}

// Reloading with other settings switches a stage to another policy.
TEST(PolicyReload, SwitchPolicyBySettings) {
  auto e = engine_for("round_robin");
  ASSERT_TRUE(e);
  TempScript s("return { pick = function(ctx, instances) return #instances end }");
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  PolicySettings st = settings_for("round_robin");
  st.specs[static_cast<int>(Stage::decode)] = s.path();
  ASSERT_TRUE(e->reload(st).ok());
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(p->pick(inst, decode_ctx()), inst[3]);
}

// --- Prefix hashes --------------------------------------------------------

// Equal prefixes give equal leading hashes; the first differing block and
// every later one differ (chaining); the partial tail is not hashed.
TEST(PrefixHash, ChainedBlocks) {
  std::string a(1000, 'a');
  std::string b = a;
  b[300] = 'b';
  const auto ha = prefix_block_hashes(a, 256);
  const auto hb = prefix_block_hashes(b, 256);
  ASSERT_EQ(ha.size(), 3u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
  EXPECT_NE(ha[2], hb[2]);  // same text in block 3, different history
  EXPECT_EQ(ha[0], ha[0] & kLuaExactMask);
  EXPECT_TRUE(prefix_block_hashes("short", 256).empty());
}

// The hash spreads small changes over all bits and depends on the seed.
TEST(PrefixHash, Hash64Basics) {
  EXPECT_NE(hash64("abc"), hash64("abd"));
  EXPECT_NE(hash64("abc", 1), hash64("abc", 2));
  EXPECT_EQ(hash64(std::string(100, 'x')), hash64(std::string(100, 'x')));
  std::set<std::uint64_t> seen;
  for (int i = 0; i < 10000; ++i)
    seen.insert(hash64(std::to_string(i)));
  EXPECT_EQ(seen.size(), 10000u);
}

// prefix_matches in a script sees what earlier picks routed.
TEST(PrefixHash, ScriptSeesRoutedPrefix) {
  auto e = engine_for("prefix_affinity");
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  const std::string prompt(4096, 'p');
  PickContext ctx = decode_ctx("a");
  ctx.prompt_raw = prompt;
  auto first = p->pick(inst, ctx);
  ASSERT_NE(first, nullptr);
  for (int i = 0; i < 10; ++i) {
    const std::string id = "b" + std::to_string(i);
    PickContext again = decode_ctx(id);
    again.prompt_raw = prompt;
    EXPECT_EQ(p->pick(inst, again), first);
  }
}

// --- The documented examples ------------------------------------------

// The first Lua block of docs/policies.md after `heading`, empty if none.
std::string doc_example(const std::string& heading) {
  std::ifstream in(std::string(PDGATE_TEST_SOURCE_DIR) + "/docs/policies.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const auto at = doc.find(heading);
  const auto start = at == std::string::npos ? at : doc.find("```lua\n", at);
  if (start == std::string::npos)
    return {};
  const auto end = doc.find("```", start + 7);
  return doc.substr(start + 7, end - start - 7);
}

// The worked example in docs/policies.md loads, passes its self-check and
// routes as the text says.
TEST(PolicyDocs, WorkedExampleRuns) {
  const std::string example = doc_example("## Writing a policy");
  ASSERT_FALSE(example.empty()) << "docs/policies.md: no example under \"Writing a policy\"";
  TempScript s(example, "tenant_split");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  inst[0]->in_flight = 3;
  inst[3]->in_flight = 1;
  PickContext premium = decode_ctx();
  premium.headers = {{"x-tenant", "premium"}};
  EXPECT_EQ(p->pick(inst, premium), inst[1]);
  EXPECT_EQ(p->pick(inst, decode_ctx()), inst[2]);
  EXPECT_EQ(e->stats().fallbacks(), 0u);
}

// The example of a policy reading the cluster-wide figures (docs/policies.md, "Replicas
// share their load") keeps a prompt where its prefix is, leaves it when every replica's
// queue there is more than a second ahead of the soonest start, and never picks an instance
// with 32 requests in flight across the replicas.
TEST(PolicyDocs, ClusterFiguresExampleRuns) {
  const std::string example = doc_example("### Replicas share their load");
  ASSERT_FALSE(example.empty()) << "docs/policies.md: no example under \"Replicas share\"";
  TempScript s(example, "cluster_figures");
  auto e = engine_for(s.path());
  ASSERT_TRUE(e);
  auto p = e->make_picker(0);
  auto inst = fake_instances(3, Role::prefill);
  const std::string prompt(8000, 'p');  // ~2,000 tokens
  auto ctx = [&](const std::string& id) {
    PickContext c = decode_ctx(id);
    c.stage = Stage::prefill;
    c.prompt_raw = prompt;
    return c;
  };
  auto home = p->pick(inst, ctx("a"));
  ASSERT_TRUE(home);
  EXPECT_EQ(p->pick(inst, ctx("b")), home);
  home->others_queued_tokens = 1500;  // another replica's queue: a cold start costs more
  EXPECT_EQ(p->pick(inst, ctx("c")), home);
  home->others_queued_tokens = 5000;  // more than 1,000 (ms, at 1 per token) behind
  EXPECT_NE(p->pick(inst, ctx("d")), home);
  home->others_queued_tokens = 0;
  home->others_in_flight = 32;
  EXPECT_NE(p->pick(inst, ctx("e")), home);
  EXPECT_EQ(e->stats().fallbacks(), 0u);
}

// --- Engine metrics -------------------------------------------------------

// vLLM V1 text: series summed over engines, kv usage averaged, comments skipped.
TEST(Metrics, ParseVllmText) {
  const auto m = parse_vllm_metrics(
      "# HELP vllm:num_requests_running Number of requests.\n"
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n"
      "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2\n"
      "vllm:num_requests_waiting{engine=\"0\",model_name=\"m {x}\"} 4 1700000000\n"
      "vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\r\n"
      "vllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n"
      "vllm:num_requests_running_other 99\n"
      "garbage line\n");
  ASSERT_TRUE(m.running && m.waiting && m.kv_usage);
  EXPECT_EQ(*m.running, 5);
  EXPECT_EQ(*m.waiting, 4);
  EXPECT_DOUBLE_EQ(*m.kv_usage, 0.5);
}

// A data-parallel rank routed to as an instance reads only its engine
// core's series (engine="<rank>"), never engine="10" for rank 1 nor a
// series without the label.
TEST(Metrics, OneRanksSeries) {
  const std::string text =
      "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\n"
      "vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 2\n"
      "vllm:num_requests_running{engine=\"10\"} 40\n"
      "vllm:num_requests_running{xengine=\"1\"} 50\n"
      "vllm:num_requests_running 60\n"
      "vllm:num_requests_waiting{engine=\"1\"} 7\n"
      "vllm:kv_cache_usage_perc{engine=\"1\"} 0.5\n";
  const auto one = parse_vllm_metrics(text, 1);
  ASSERT_TRUE(one.running && one.waiting && one.kv_usage);
  EXPECT_EQ(*one.running, 2);
  EXPECT_EQ(*one.waiting, 7);
  EXPECT_DOUBLE_EQ(*one.kv_usage, 0.5);
  const auto zero = parse_vllm_metrics(text, 0);
  ASSERT_TRUE(zero.running);
  EXPECT_EQ(*zero.running, 3);
  EXPECT_FALSE(zero.waiting);
  EXPECT_EQ(*parse_vllm_metrics(text).running, 155);
}

// Older vLLM's gpu_cache_usage_perc is used when the new name is absent.
TEST(Metrics, OldKvName) {
  const auto m =
      parse_vllm_metrics("vllm:gpu_cache_usage_perc 0.4\nvllm:num_requests_waiting NaN\n");
  ASSERT_TRUE(m.kv_usage);
  EXPECT_DOUBLE_EQ(*m.kv_usage, 0.4);
  EXPECT_FALSE(m.running);
  EXPECT_FALSE(m.waiting);  // NaN is not a number we store
}

}  // namespace
}  // namespace pdgate::policy
