// Cost of one pick for each shipped policy, of the prefix hashes, and of
// running policies interpreted with a budget hook instead of JIT-compiled.
#include <benchmark/benchmark.h>
#include <lua.hpp>

#include <string>
#include <vector>

#include "core/pipeline/client_key.hpp"
#include "core/routing/request_hook.hpp"
#include "plugins/redis_kv_index.hpp"
#include "policies/engine.hpp"
#include "policies/local_kv_index.hpp"
#include "policies/prefix_hash.hpp"

namespace pdgate::policy {
namespace {

std::vector<InstancePtr> instances(std::size_t n) {
  std::vector<InstancePtr> out;
  for (std::size_t i = 0; i < n; ++i) {
    UpstreamSpec spec;
    spec.role = Role::decode;
    spec.host = "10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
    spec.port = 8000;
    spec.url = "http://" + spec.host + ":8000";
    auto inst = std::make_shared<Instance>(i + 1, spec);
    inst->in_flight = static_cast<std::int64_t>((i * 7) % 13);
    out.push_back(std::move(inst));
  }
  return out;
}

// A realistic prompt: a shared system prompt and a per-conversation tail,
// so prefix_affinity finds partial matches.
std::string prompt(std::size_t bytes, int conversation) {
  std::string p = "[{\"role\":\"system\",\"content\":\"";
  while (p.size() < bytes / 2)
    p += "You are a helpful assistant. ";
  const std::string tail = "conversation " + std::to_string(conversation) + " says hello. ";
  while (p.size() < bytes)
    p += tail;
  p.resize(bytes);
  return p;
}

// args: instance count, prompt bytes. One pick per iteration, a new
// request each time (so prefix hashes are computed, not cached), while a
// few instances' in-flight counts change as they would under load.
// `shared`: the KV-location index replicas share through Redis
// (plugins/redis_kv_index.hpp) instead of the in-process one. Its thread is
// not started: what a pick pays is the local index plus encoding each
// record and appending it to the publish queue, whose bound then drops the
// oldest batches, as with Redis down (the most the pick path can pay).
void BM_Pick(benchmark::State& state, const char* policy, bool shared = false) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  std::shared_ptr<KvLocationIndex> index = std::make_shared<LocalKvIndex>();
  if (shared)
    index = std::make_shared<RedisKvIndex>(index, RedisKvIndexSettings{});
  auto engine = PolicyEngine::create(
      [&] {
        PolicySettings s;
        s.specs = {policy, policy, policy};
        return s;
      }(),
      index);
  if (!engine) {
    state.SkipWithError(engine.error().c_str());
    return;
  }
  auto picker = (*engine)->make_picker(0);
  auto inst = instances(n);
  std::vector<std::string> prompts;
  for (int c = 0; c < 16; ++c)
    prompts.push_back(prompt(bytes, c));
  std::vector<std::string> ids;
  for (int i = 0; i < 64; ++i)
    ids.push_back("req-" + std::to_string(i));
  PickContext ctx;
  ctx.stage = Stage::decode;
  ctx.model = "m";
  std::size_t i = 0;
  for (auto _ : state) {
    ctx.request_id = ids[i % ids.size()];
    ctx.prompt_raw = prompts[i % prompts.size()];
    std::string conv = "c" + std::to_string(i % 97);
    ctx.conversation_id = conv;
    inst[i % n]->in_flight.fetch_add(1, std::memory_order_relaxed);
    benchmark::DoNotOptimize(picker->pick(inst, ctx));
    inst[(i + n / 2) % n]->in_flight.fetch_sub(1, std::memory_order_relaxed);
    ++i;
  }
  if ((*engine)->stats().fallbacks() != 0)
    state.SkipWithError("policy fell back");
}

void pick_args(benchmark::internal::Benchmark* b) {
  b->Args({8, 1024})->Args({256, 1024});
}

BENCHMARK_CAPTURE(BM_Pick, round_robin, "round_robin")->Apply(pick_args);
BENCHMARK_CAPTURE(BM_Pick, least_load, "least_load")->Apply(pick_args);
BENCHMARK_CAPTURE(BM_Pick, power_of_two, "power_of_two")->Apply(pick_args);
BENCHMARK_CAPTURE(BM_Pick, session_affinity, "session_affinity")->Apply(pick_args);
BENCHMARK_CAPTURE(BM_Pick, conversation_decode, "conversation_decode")->Apply(pick_args);
BENCHMARK_CAPTURE(BM_Pick, prefix_affinity, "prefix_affinity")
    ->Args({8, 1024})
    ->Args({256, 1024})
    ->Args({8, 32 * 1024})
    ->Args({256, 32 * 1024});
// The same with the index shared by replicas (issue 15).
BENCHMARK_CAPTURE(BM_Pick, prefix_affinity_shared, "prefix_affinity", true)
    ->Args({256, 1024})
    ->Args({256, 32 * 1024});
BENCHMARK_CAPTURE(BM_Pick, conversation_decode_shared, "conversation_decode", true)
    ->Args({256, 1024});

BENCHMARK_CAPTURE(BM_Pick, cache_aware, "cache_aware")
    ->Args({8, 1024})
    ->Args({256, 1024})
    ->Args({8, 32 * 1024})
    ->Args({256, 32 * 1024});

// One request hook call (docs/policies.md, on_request) the way the
// pipeline makes it, for: a policy without one (what every request pays
// for the phase), the worked example's tenant split (reads the key's
// label, a header edit, max_tokens cap and priority), and conditional_pd
// (the prompt estimate, and prefix_held for long prompts).
void BM_RequestHook(benchmark::State& state, const char* policy, std::size_t prompt_bytes) {
  auto engine = PolicyEngine::create([&] {
    PolicySettings s;
    s.specs = {policy, policy, policy};
    return s;
  }());
  if (!engine) {
    state.SkipWithError(engine.error().c_str());
    return;
  }
  auto picker = (*engine)->make_picker(0);
  // conditional_pd's prefix_held looks among the instances a decode pick
  // last offered.
  auto inst = instances(8);
  PickContext pick_ctx;
  pick_ctx.request_id = "warm";
  picker->pick(inst, pick_ctx);
  const std::string body =
      R"({"model":"m","max_tokens":2000,"messages":)" + prompt(prompt_bytes, 1) + R"("}]})";
  const auto index = index_json_object(body);
  if (!index) {
    state.SkipWithError(index.error().c_str());
    return;
  }
  ClientKey key;
  key.name = "globex";
  key.labels = {{"tier", "standard"}};
  RequestHookInput in;
  in.body = body;
  in.index = &*index;
  in.is_chat = true;
  in.model = "m";
  in.prompt_bytes = prompt_bytes;
  in.key = &key;
  std::vector<std::string> ids;
  for (int i = 0; i < 64; ++i)
    ids.push_back("req-" + std::to_string(i));
  std::size_t i = 0;
  for (auto _ : state) {
    in.request_id = ids[i++ % ids.size()];
    RequestDecision d;
    benchmark::DoNotOptimize(picker->on_request(in, d));
    if (d.reject_status != 0 || d.failed_closed) {
      state.SkipWithError("the hook refused the request");
      break;
    }
  }
}
BENCHMARK_CAPTURE(BM_RequestHook, none, "least_load", 1024);
BENCHMARK_CAPTURE(BM_RequestHook, tenant_split,
                  PDGATE_SOURCE_DIR "/examples/tenants/tenant_split.lua", 1024);
BENCHMARK_CAPTURE(BM_RequestHook, conditional_pd_short, "conditional_pd", 512);
BENCHMARK_CAPTURE(BM_RequestHook, conditional_pd_long, "conditional_pd", 32 * 1024);

// The C++ round-robin picker, for scale.
void BM_PickNativeRoundRobin(benchmark::State& state) {
  auto picker = RoundRobinPicker::factory()(0);
  auto inst = instances(static_cast<std::size_t>(state.range(0)));
  PickContext ctx;
  for (auto _ : state)
    benchmark::DoNotOptimize(picker->pick(inst, ctx));
}
BENCHMARK(BM_PickNativeRoundRobin)->Arg(8)->Arg(256);

void BM_PrefixHashes(benchmark::State& state) {
  const std::string text = prompt(static_cast<std::size_t>(state.range(0)), 1);
  for (auto _ : state)
    benchmark::DoNotOptimize(prefix_block_hashes(text, 256));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_PrefixHashes)->Arg(1 << 10)->Arg(32 << 10)->Arg(1 << 20);

// What turning the JIT off (needed for the budget hook) costs: a
// least-load scan over 256 instance tables in a bare LuaJIT state, with
// the JIT on, off, and off with the count hook the engine installs.
void BM_LuaScan(benchmark::State& state) {
  const bool jit = state.range(0) != 0;
  const bool hook = state.range(1) != 0;
  lua_State* L = luaL_newstate();
  luaL_openlibs(L);
  if (!jit)
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
  if (hook)
    lua_sethook(
        L, [](lua_State*, lua_Debug*) {}, LUA_MASKCOUNT, 1000);
  const char* code = R"lua(
    local inst = {}
    for i = 1, 256 do inst[i] = { healthy = true, in_flight = (i * 7) % 13 } end
    return function()
      local best, bl = nil, math.huge
      for i = 1, #inst do
        local x = inst[i]
        if x.healthy and x.in_flight < bl then best, bl = x, x.in_flight end
      end
      return best
    end
  )lua";
  if (luaL_loadstring(L, code) != 0 || lua_pcall(L, 0, 1, 0) != 0) {
    state.SkipWithError("lua setup failed");
    lua_close(L);
    return;
  }
  const int fn = luaL_ref(L, LUA_REGISTRYINDEX);
  for (auto _ : state) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, fn);
    lua_call(L, 0, 1);
    lua_pop(L, 1);
  }
  lua_close(L);
}
BENCHMARK(BM_LuaScan)->ArgNames({"jit", "hook"})->Args({1, 0})->Args({0, 0})->Args({0, 1});

}  // namespace
}  // namespace pdgate::policy

BENCHMARK_MAIN();
