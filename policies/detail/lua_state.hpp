// The state one policy VM keeps, shared by the files that make up the VM:
// lua_vm.cpp (its lifecycle and the entry points the engine calls),
// lua_sandbox.cpp (the limits every call runs under), and what scripts see
// (lua_pdgate_lib.cpp, lua_request_api.cpp, lua_context.cpp). Only those
// files include it; the rest of pdgate knows a LuaVm by lua_vm.hpp alone.
#pragma once

#include <lua.hpp>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "policies/lua_vm.hpp"
#include "policies/lua_watchdog.hpp"

namespace pdgate::policy {

namespace detail {

using Clock = std::chrono::steady_clock;

}  // namespace detail

struct LuaVm::Impl {
  lua_State* L = nullptr;
  VmServices svc;
  std::size_t mem_used = 0;
  std::size_t mem_limit = 0;

  // The running call's deadline; the count hook compares against it.
  detail::Clock::time_point deadline{};
  // Hook calls since the call began, i.e. thousands of instructions run.
  std::int64_t ticks = 0;
  std::int64_t min_ticks = 0;
  bool in_call = false;
  bool timed_out = false;
  // C functions currently re-entering Lua (budget::enter).
  int c_depth = 0;
  // Set by the watchdog's signal: the count hook runs after every
  // instruction until the call ends (fast_steps counts them, so that
  // `ticks` still counts thousands of instructions).
  volatile std::sig_atomic_t fast_hook = 0;
  std::int64_t fast_steps = 0;
  // CPU time when the call was first seen past its deadline with few
  // instructions run, and when count_hook last looked (see there).
  detail::Clock::duration cpu_mark{};
  detail::Clock::time_point cpu_mark_at{};
  PolicyWatchdog* watchdog = nullptr;
  PolicyWatchdog::Slot* watchdog_slot = nullptr;

  struct StageScript {
    int pick_ref = LUA_NOREF;
    int complete_ref = LUA_NOREF;
    std::string origin;
    // The shipped round_robin, which pick() runs natively (see there).
    bool native_round_robin = false;
    bool fail_closed = false;
    PolicyCounters* counters = nullptr;
    // --policy-log-level's level for this script (spdlog's), -1: none.
    int log_level = -1;
  };
  std::array<StageScript, 3> stages;
  // The decode script's on_request, and the metatables of its `req` and
  // `req.body` handles.
  int request_ref = LUA_NOREF;
  int req_meta_ref = LUA_NOREF;
  int body_meta_ref = LUA_NOREF;
  // The counters when the engine gave none (tests, fuzzers).
  std::unique_ptr<PolicyMetrics> own_metrics;

  // The instance tables handed to a stage's pick, kept between picks:
  // only numbers that changed are written, so a pick over 256 instances
  // does not rebuild 256 tables.
  struct Shadow {
    std::int64_t in_flight = -1;
    std::int64_t others_in_flight = -1;
    std::int64_t queued_tokens = -1;  // cluster-wide
    double ms_per_token = -1;
    std::int64_t metrics_at = -1;  // the scrape the metric fields came from
    bool healthy = false;
    bool has_metrics = false;
    bool valid = false;
  };
  struct InstanceCache {
    std::vector<const Instance*> ptrs;
    std::vector<std::uint64_t> ids;
    // What the KV-location index calls each instance (its URL's key).
    std::vector<InstanceKey> keys;
    // Instance::meta_version() when its table was built: labels and weight
    // changed at run time rebuild the array.
    std::vector<std::uint64_t> versions;
    std::vector<Shadow> shadow;
    int array_ref = LUA_NOREF;
  };
  std::array<InstanceCache, 3> caches;
  int ctx_ref = LUA_NOREF;
  // Which of the request's fields (kCtxFields) the current call's ctx
  // table holds: they are filled when a script first reads them.
  std::uint32_t ctx_filled = 0;
  int outcome_ref = LUA_NOREF;
  int empty_ref = LUA_NOREF;  // a shared empty table (headers when none)
  // A registry slot (holding false between calls) for a call's argument
  // built fresh each call (on_request's req, on_complete's chosen
  // instance): it is built inside a protected call (run_protected) and
  // only fetched outside it, which allocates nothing.
  int arg_ref = LUA_NOREF;
  // ctx.vars: each request's table by PickContext::serial (a registry
  // table, made on first use), and the serials in the order their tables
  // were made: past kMaxVars the oldest is dropped, so requests that end
  // without their decode being reported cannot pile up.
  static constexpr std::size_t kMaxVars = 4096;
  int vars_ref = LUA_NOREF;
  // require's modules by name (a registry table; false while loading).
  int modules_ref = LUA_NOREF;
  std::deque<std::uint64_t> vars_order;

  // The request being handled, for the pdgate.* helpers.
  const PickContext* cur_ctx = nullptr;
  PrefixHashCache* cur_hashes = nullptr;
  std::size_t cur_candidates = 0;
  const std::vector<InstancePtr>* cur_list = nullptr;  // during a pick only
  std::int64_t cur_now_ms = 0;
  bool prefix_used = false;
  // During a pick: the prompt tokens each candidate (by position) holds,
  // as the lookups made so far found (the larger of the approximate and
  // the exact answer); empty until a lookup runs.
  std::vector<std::int64_t> cur_cached;
  // pdgate.least_cost's per-candidate predictions (kept: no allocation
  // per pick once it has grown).
  std::vector<double> cur_costs;
  // The pick's candidates' mean learnt prefill cost (load_model.hpp), -1
  // until a helper needs it.
  double cur_fleet_cost = -1;
  // During self_check(): its fake instances' routes are not recorded.
  bool checking = false;
  // An explaining VM (VmServices::dry): whatever would change state
  // shared with the workers (the store, rate logs, rotation counters, the
  // KV-location index, counters) answers as it would and changes
  // nothing. Its writes to the store are kept here, so that its own later
  // reads see them; pdgate.log lines are kept for the explanation.
  bool dry = false;
  static constexpr std::size_t kMaxDryWrites = 256;
  static constexpr std::size_t kMaxDryLog = 32;
  std::unordered_map<std::string, std::optional<KvValue>> dry_kv;
  std::vector<std::string> dry_log;
  // The request hook's request and decision, during on_request only.
  const RequestHookInput* cur_hook = nullptr;
  RequestDecision* cur_decision = nullptr;
  // Whose counters pdgate.count and pdgate.log use: a Stage, or
  // kRequestHook (-1 outside calls).
  int cur_where = -1;

  ~Impl() {
    if (L != nullptr)
      lua_close(L);
    if (watchdog != nullptr)
      watchdog->release(watchdog_slot);
  }

  const std::vector<std::uint64_t>& hashes() {
    prefix_used = true;
    return cur_hashes->get(*cur_ctx, svc.prefix_block_bytes);
  }
};

namespace detail {

using Impl = LuaVm::Impl;

inline std::int64_t steady_ms(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// The VM a state belongs to: its allocator's userdata (limited_alloc in
// lua_sandbox.cpp), so every C function Lua calls finds it without a
// registry lookup.
inline Impl& impl_of(lua_State* L) {
  void* ud = nullptr;
  lua_getallocf(L, &ud);
  return *static_cast<Impl*>(ud);
}

}  // namespace detail

}  // namespace pdgate::policy
