// A policy VM's lifecycle and the entry points the engine calls: loading
// a version's scripts into a fresh sandboxed state, then pick, on_complete
// and on_request, each setting up the request the call sees, running the
// script under the budget and checking its answer. The rest of the VM is
// split by job: the sandbox and its limits (lua_sandbox.cpp), and what
// scripts see: the `pdgate` module (lua_pdgate_lib.cpp), the request
// hook's `req` (lua_request_api.cpp), ctx and the instance tables
// (lua_context.cpp); policies/detail/ holds what they share.
#include "policies/lua_vm.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/pipeline/client_key.hpp"

#include "policies/detail/lua_bindings.hpp"
#include "policies/detail/lua_sandbox.hpp"
#include "policies/detail/lua_state.hpp"
#include "policies/prefix_hash.hpp"

namespace pdgate::policy {

using detail::budgeted_call;
using detail::Clock;
using detail::Impl;
using detail::pop_call_error;
using detail::pop_error;
using detail::push_ctx;
using detail::push_instances;
using detail::push_sandbox_env;
using detail::steady_ms;

const char* to_string(HookStatus s) {
  switch (s) {
    case HookStatus::accepted:
      return "accepted";
    case HookStatus::rejected:
      return "rejected";
    case HookStatus::error:
      return "error";
    case HookStatus::invalid:
      return "invalid";
    case HookStatus::budget:
      return "budget";
  }
  return "?";
}

const char* to_string(PickStatus s) {
  switch (s) {
    case PickStatus::chosen:
      return "chosen";
    case PickStatus::declined:
      return "declined";
    case PickStatus::rejected:
      return "rejected";
    case PickStatus::recheck:
      return "recheck";
    case PickStatus::error:
      return "error";
    case PickStatus::invalid:
      return "invalid";
    case PickStatus::budget:
      return "budget";
  }
  return "?";
}

namespace {

// Loading a script (its top-level code) may build tables; it runs once per
// reload, off the pick path, so it gets a larger budget.
constexpr auto kLoadBudget = std::chrono::milliseconds(200);

// Sets up the request the pdgate.* helpers see, and clears it on exit.
class CallScope {
 public:
  CallScope(Impl& I, const PickContext& ctx, PrefixHashCache& h, std::size_t candidates,
            const std::vector<InstancePtr>* list = nullptr)
      : I_(I) {
    I.cur_list = list;
    I.cur_ctx = &ctx;
    I.cur_hashes = &h;
    I.cur_candidates = candidates;
    I.prefix_used = false;
    I.cur_cached.clear();
    I.cur_fleet_cost = -1;
    I.cur_where = static_cast<int>(ctx.stage);
  }
  ~CallScope() {
    I_.cur_where = -1;
    I_.cur_ctx = nullptr;
    I_.cur_hashes = nullptr;
    I_.cur_list = nullptr;
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  Impl& I_;
};

// A refusal's status (at `at`), message (at + 1) and headers table
// (at + 2) as a hook or pick returned them. Returns an error for a
// status outside 400..599 or a message that is not a string or nil; a
// header out of bounds is dropped and named in `dropped`. The table is
// walked raw: outside the protected call no metamethod may run.
std::optional<std::string> read_refusal(lua_State* L, int at, unsigned& status,
                                        std::string& message,
                                        std::vector<std::pair<std::string, std::string>>& headers,
                                        std::string& dropped) {
  const double d = lua_tonumber(L, at);
  std::size_t n = 0;
  const char* msg = lua_type(L, at + 1) == LUA_TSTRING ? lua_tolstring(L, at + 1, &n) : nullptr;
  if (!(d >= 400 && d <= 599 && d == std::floor(d)) || (msg == nullptr && !lua_isnil(L, at + 1)))
    return "a refusal is a status 400..599, an optional message string and an optional table of "
           "headers (got status " +
           std::to_string(d) + ")";
  status = static_cast<unsigned>(d);
  message = msg != nullptr ? std::string(msg, std::min<std::size_t>(n, 1024))
                           : std::string("request refused by policy");
  if (lua_isnil(L, at + 2))
    return std::nullopt;
  if (!lua_istable(L, at + 2))
    return std::string("a refusal's headers must be a table, not a ") +
           lua_typename(L, lua_type(L, at + 2));
  lua_pushnil(L);
  while (lua_next(L, at + 2) != 0) {
    // Keys and values are copied, never converted in place (that would
    // break lua_next); numbers (Retry-After = 5) are written as integers.
    std::string name, value;
    bool ok = lua_type(L, -2) == LUA_TSTRING;
    if (ok) {
      std::size_t kn = 0;
      const char* k = lua_tolstring(L, -2, &kn);
      name.assign(k, std::min<std::size_t>(kn, kMaxHeaderNameBytes + 1));
    }
    if (lua_type(L, -1) == LUA_TSTRING) {
      std::size_t vn = 0;
      const char* v = lua_tolstring(L, -1, &vn);
      value.assign(v, std::min<std::size_t>(vn, kMaxRefusalValueBytes + 1));
    } else if (lua_type(L, -1) == LUA_TNUMBER && lua_tonumber(L, -1) >= 0 &&
               lua_tonumber(L, -1) < 1e15) {
      value = std::to_string(static_cast<std::int64_t>(std::ceil(lua_tonumber(L, -1))));
    } else {
      ok = false;
    }
    lua_pop(L, 1);
    std::optional<std::string> why;
    if (!ok)
      why = "headers map names to strings or numbers";
    else if (headers.size() >= kMaxRefusalHeaders)
      why = "at most " + std::to_string(kMaxRefusalHeaders) + " headers";
    else
      why = refusal_header_error(name, value);
    if (why) {
      if (dropped.size() < 512)
        dropped +=
            (dropped.empty() ? "" : "; ") + (name.empty() ? std::string("?") : name) + ": " + *why;
      continue;
    }
    headers.emplace_back(std::move(name), std::move(value));
  }
  return std::nullopt;
}

// Empties the argument slot (an existing registry entry: no allocation),
// so the state does not keep the last call's argument alive.
void release_arg(Impl& I) {
  lua_pushboolean(I.L, 0);
  lua_rawseti(I.L, LUA_REGISTRYINDEX, I.arg_ref);
}

}  // namespace

// A few recent requests' hashes: a request's prefill and decode picks
// happen on the same worker, with other requests' picks in between.
const std::vector<std::uint64_t>& PrefixHashCache::get(const PickContext& ctx,
                                                       std::size_t block_bytes) {
  for (auto& e : slots_) {
    if (e.data == ctx.prompt_raw.data() && e.size == ctx.prompt_raw.size() &&
        e.request_id == ctx.request_id)
      return e.hashes;
  }
  Entry& e = slots_[next_];
  next_ = (next_ + 1) % kSlots;
  e.request_id.assign(ctx.request_id);
  e.data = ctx.prompt_raw.data();
  e.size = ctx.prompt_raw.size();
  e.hashes = prefix_block_hashes(ctx.prompt_raw, block_bytes);
  return e.hashes;
}

LuaVm::LuaVm(std::unique_ptr<Impl> impl, std::uint64_t generation)
    : impl_(std::move(impl)), generation_(generation) {}

LuaVm::~LuaVm() = default;

std::size_t LuaVm::memory_used() const {
  return impl_->mem_used;
}

bool LuaVm::has_on_complete(Stage s) const {
  return impl_->stages[static_cast<int>(s)].complete_ref != LUA_NOREF;
}

Result<std::unique_ptr<LuaVm>> LuaVm::create(const PolicyBundle& bundle,
                                             const VmServices& services) {
  auto I = std::make_unique<Impl>();
  I->svc = services;
  I->dry = services.dry;
  I->mem_limit = services.memory_limit;
  I->watchdog = services.watchdog;
  if (I->watchdog != nullptr)
    I->watchdog_slot = I->watchdog->acquire();
  if (auto opened = detail::open_sandboxed_state(*I); !opened)
    return fail(opened.error());
  lua_State* L = I->L;
  detail::register_pdgate_lib(L);
  detail::create_context_tables(*I);
  detail::create_request_metatables(*I);
  PolicyMetrics* metrics = services.metrics;
  if (metrics == nullptr) {
    I->own_metrics = std::make_unique<PolicyMetrics>();
    metrics = I->own_metrics.get();
  }

  // A script named for several stages is loaded once and shares its state.
  std::vector<std::pair<std::string, int>> loaded;  // origin -> hooks table ref
  for (int s = 0; s < 3; ++s) {
    const PolicySource& src = bundle.stages[s];
    int hooks_ref = LUA_NOREF;
    for (const auto& [origin, ref] : loaded) {
      if (origin == src.origin)
        hooks_ref = ref;
    }
    if (hooks_ref == LUA_NOREF) {
      // Mode "t": text only, never precompiled bytecode, which LuaJIT
      // does not verify and which can corrupt the VM.
      if (!src.text.empty() && src.text.front() == '\x1b') {
        return fail("policy " + src.origin +
                    ": precompiled bytecode is not accepted; give the Lua source");
      }
      const std::string chunk_name = "@" + src.origin;
      if (luaL_loadbufferx(L, src.text.data(), src.text.size(), chunk_name.c_str(), "t") != 0) {
        return fail("policy " + src.origin + ": " + pop_error(L));
      }
      push_sandbox_env(L);
      lua_setfenv(L, -2);
      if (budgeted_call(*I, 0, 1, kLoadBudget) != 0) {
        return fail("policy " + src.origin + ": " + pop_call_error(*I));
      }
      if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        return fail("policy " + src.origin + ": the script must return a table of hooks");
      }
      hooks_ref = luaL_ref(L, LUA_REGISTRYINDEX);
      loaded.emplace_back(src.origin, hooks_ref);
    }
    auto& st = I->stages[s];
    st.origin = src.origin;
    // Only the shipped script: a file named round_robin.lua is the user's.
    st.native_round_robin = src.origin == "builtin:round_robin";
    lua_rawgeti(L, LUA_REGISTRYINDEX, hooks_ref);
    lua_getfield(L, -1, "pick");
    if (!lua_isfunction(L, -1)) {
      lua_pop(L, 2);
      return fail("policy " + src.origin + ": the returned table has no pick function");
    }
    st.pick_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "on_complete");
    if (lua_isfunction(L, -1)) {
      st.complete_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    } else if (lua_isnil(L, -1)) {
      lua_pop(L, 1);
    } else {
      lua_pop(L, 2);
      return fail("policy " + src.origin + ": on_complete must be a function");
    }
    lua_getfield(L, -1, "fail_closed");
    if (!lua_isnil(L, -1) && !lua_isboolean(L, -1)) {
      lua_pop(L, 2);
      return fail("policy " + src.origin + ": fail_closed must be true or false");
    }
    st.fail_closed = lua_toboolean(L, -1) != 0;
    lua_pop(L, 1);
    st.counters = &metrics->for_policy(policy_label(src.spec));
    for (const auto& [name, level] : services.log_levels) {
      if (name == st.counters->name() && services.logger)
        st.log_level = level;
    }
    // The request hook runs once per request, before any stage: the
    // decode script, the one stage every request has, holds it.
    if (s == static_cast<int>(Stage::decode)) {
      lua_getfield(L, -1, "on_request");
      if (lua_isfunction(L, -1)) {
        I->request_ref = luaL_ref(L, LUA_REGISTRYINDEX);
      } else if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
      } else {
        lua_pop(L, 2);
        return fail("policy " + src.origin + ": on_request must be a function");
      }
    }
    lua_pop(L, 1);
  }
  return std::unique_ptr<LuaVm>(new LuaVm(std::move(I), bundle.generation));
}

namespace {

// The shipped round_robin (policies/round_robin.lua) without entering the
// interpreter: the same counter in the shared store (so the rotation is
// shared by every worker, and visible to scripts, exactly as the script
// keeps it), the same floored modulo, the same walk past unhealthy
// instances, the same answer. A pick through the interpreter costs ~3,300
// instructions more (filling ctx and the instance tables, the budgeted
// call); the default policy pays that on every request. Nullopt when the
// script itself must run (a counter someone set to a fraction).
std::optional<PickAnswer> round_robin_natively(Impl& I, const std::vector<InstancePtr>& candidates,
                                               Stage stage) {
  if (I.svc.kv == nullptr)
    return std::nullopt;
  std::string_view key;
  switch (stage) {
    case Stage::encode:
      key = "round_robin:encode";
      break;
    case Stage::prefill:
      key = "round_robin:prefill";
      break;
    case Stage::decode:
      key = "round_robin:decode";
      break;
  }
  // `pdgate.kv_incr(key) or 0`; explaining, what it would return.
  const std::int64_t now_ms = steady_ms(Clock::now());
  auto r = I.dry ? I.svc.kv->incr_peek(key, 1, now_ms) : I.svc.kv->incr(key, 1, now_ms);
  const double turn = r ? *r : 0;
  PickAnswer a;
  const std::size_t n = candidates.size();
  if (n == 0) {
    a.status = PickStatus::declined;
    return a;
  }
  // Lua's `turn % n` (floored, on doubles).
  const double start = turn - std::floor(turn / static_cast<double>(n)) * static_cast<double>(n);
  if (start != std::floor(start) || !(start >= 0))
    return std::nullopt;
  const auto first = static_cast<std::size_t>(start);
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = (first + k) % n;
    if (candidates[i]->healthy.load(std::memory_order_relaxed)) {
      a.status = PickStatus::chosen;
      a.index = i;
      return a;
    }
  }
  a.status = PickStatus::declined;  // none healthy: the gateway falls back
  return a;
}

}  // namespace

PickAnswer LuaVm::pick(const std::vector<InstancePtr>& candidates, const PickContext& ctx,
                       PrefixHashCache& hashes) {
  Impl& I = *impl_;
  if (I.stages[static_cast<int>(ctx.stage)].native_round_robin) {
    if (auto a = round_robin_natively(I, candidates, ctx.stage))
      return *a;
  }
  lua_State* L = I.L;
  PickAnswer a;
  const auto now = Clock::now();
  const int base = lua_gettop(L);
  CallScope scope(I, ctx, hashes, candidates.size(), &candidates);
  I.cur_now_ms = steady_ms(now);
  // ctx and the instances are made ready in the state under protection
  // (they may not fit in what the script left of --policy-memory); an
  // out-of-memory there fails the pick like an error in the script.
  if (auto err = detail::run_protected(L, [&](lua_State* S) {
        push_ctx(I, ctx);
        lua_pop(S, 1);
        push_instances(I, ctx.stage, candidates, steady_ms(now));
        lua_pop(S, 1);
      })) {
    a.status = PickStatus::error;
    a.error = std::move(*err);
    lua_settop(L, base);
    return a;
  }
  const int array_ref = I.caches[static_cast<int>(ctx.stage)].array_ref;
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.stages[static_cast<int>(ctx.stage)].pick_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.ctx_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, array_ref);
  // The answer, then a refusal's status, message and headers.
  const int status = budgeted_call(I, 2, 4, I.svc.budget);
  if (status != 0) {
    a.status = I.timed_out ? PickStatus::budget : PickStatus::error;
    a.error = pop_call_error(I);
    lua_settop(L, base);
    return a;
  }
  // The answer on top, as one result left it; status, message, headers
  // from base + 1.
  lua_pushvalue(L, base + 1);
  lua_remove(L, base + 1);
  const int t = lua_type(L, -1);
  if ((t == LUA_TNIL || (t == LUA_TBOOLEAN && lua_toboolean(L, -1) == 0)) &&
      !lua_isnil(L, base + 1)) {
    PickRefusal& r = a.refusal;
    if (auto err = read_refusal(L, base + 1, r.status, r.message, r.headers, a.error)) {
      a.status = PickStatus::invalid;
      a.error = "pick returned nil and " + *err;
    } else {
      a.status = PickStatus::rejected;
      r.reason = "rejected";
    }
  } else if (t == LUA_TNIL || (t == LUA_TBOOLEAN && lua_toboolean(L, -1) == 0)) {
    a.status = PickStatus::declined;
  } else if (t == LUA_TNUMBER) {
    const double d = lua_tonumber(L, -1);
    if (d >= 1 && d <= static_cast<double>(candidates.size()) && d == std::floor(d)) {
      a.status = PickStatus::chosen;
      a.index = static_cast<std::size_t>(d) - 1;
    } else {
      a.status = PickStatus::invalid;
      a.error = "pick returned " + std::to_string(d) + ", not a position in instances (1.." +
                std::to_string(candidates.size()) + ")";
    }
  } else if (t == LUA_TTABLE) {
    // An instance table: it must be one of this pick's, not a copy. Read
    // raw: outside the protected call no metamethod of the script may run
    // (and the key string exists: every instance table has it).
    lua_pushliteral(L, "index");
    lua_rawget(L, -2);
    const double d = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : 0;
    lua_pop(L, 1);
    bool ok = d >= 1 && d <= static_cast<double>(candidates.size()) && d == std::floor(d);
    if (ok) {
      lua_rawgeti(L, LUA_REGISTRYINDEX, array_ref);
      lua_rawgeti(L, -1, static_cast<int>(d));
      ok = lua_rawequal(L, -1, -3) != 0;
      lua_pop(L, 2);
    }
    if (ok) {
      a.status = PickStatus::chosen;
      a.index = static_cast<std::size_t>(d) - 1;
    } else {
      a.status = PickStatus::invalid;
      a.error = "pick returned a table that is not one of the instances";
    }
  } else if (t == LUA_TLIGHTUSERDATA && lua_touserdata(L, -1) == detail::recheck_token()) {
    if (ctx.rechecked) {
      a.status = PickStatus::invalid;
      a.error = "pick returned pdgate.RECHECK again (ctx.rechecked: this pick must answer)";
    } else {
      a.status = PickStatus::recheck;
    }
  } else {
    a.status = PickStatus::invalid;
    a.error = std::string("pick returned a ") + lua_typename(L, t) +
              " (expected an instance, its position, nil, or pdgate.RECHECK)";
  }
  lua_settop(L, base);
  if (a.status == PickStatus::chosen && a.index < I.cur_cached.size())
    a.cached_tokens = I.cur_cached[a.index];
  if (a.status == PickStatus::chosen && I.prefix_used && !I.checking && !I.dry) {
    I.svc.kv_index->record_prefix(hashes.get(ctx, I.svc.prefix_block_bytes),
                                  I.caches[static_cast<int>(ctx.stage)].keys[a.index],
                                  steady_ms(now));
  }
  return a;
}

std::optional<std::string> LuaVm::on_complete(const Instance& chosen, const PickContext& ctx,
                                              const PickOutcome& outcome, PrefixHashCache& hashes) {
  Impl& I = *impl_;
  const auto& st = I.stages[static_cast<int>(ctx.stage)];
  if (st.complete_ref == LUA_NOREF)
    return std::nullopt;
  lua_State* L = I.L;
  const int base = lua_gettop(L);
  CallScope scope(I, ctx, hashes, 0);
  // Built under protection, as a pick's arguments are (see pick).
  if (auto err = detail::run_protected(L, [&](lua_State* S) {
        push_ctx(I, ctx);
        lua_pop(S, 1);
        detail::push_chosen_instance(I, ctx.stage, chosen);
        lua_rawseti(S, LUA_REGISTRYINDEX, I.arg_ref);
        detail::push_outcome(I, outcome);
        lua_pop(S, 1);
      })) {
    lua_settop(L, base);
    return err;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, st.complete_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.ctx_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.arg_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.outcome_ref);
  const int status = budgeted_call(I, 3, 0, I.svc.budget);
  std::optional<std::string> err;
  if (status != 0)
    err = (I.timed_out ? "budget: " : "") + pop_call_error(I);
  lua_settop(L, base);
  release_arg(I);
  return err;
}

void LuaVm::prime(Stage stage, const std::vector<InstancePtr>& candidates) {
  Impl& I = *impl_;
  if (!I.dry || candidates.empty())
    return;
  const int base = lua_gettop(I.L);
  // Under protection, as a pick builds them; a failure leaves the stage
  // unprimed, as on a worker that has not picked yet.
  (void)detail::run_protected(I.L, [&](lua_State* S) {
    push_instances(I, stage, candidates, steady_ms(Clock::now()));
    lua_pop(S, 1);
  });
  lua_settop(I.L, base);
}

std::vector<std::string> LuaVm::take_log() {
  return std::exchange(impl_->dry_log, {});
}

void LuaVm::explain_candidates(const std::vector<InstancePtr>& candidates, const PickContext& ctx,
                               PrefixHashCache& hashes, PickExplanation& out) {
  Impl& I = *impl_;
  const std::size_t n = candidates.size();
  const auto& h = hashes.get(ctx, I.svc.prefix_block_bytes);
  out.prompt_blocks = static_cast<std::int64_t>(h.size());
  out.prefix_blocks.assign(n, 0);
  out.exact_tokens.assign(n, -1);
  out.cached_tokens.assign(n, 0);
  for (std::size_t i = 0; i < n && i < I.cur_cached.size(); ++i)
    out.cached_tokens[i] = I.cur_cached[i];
  std::vector<InstanceKey> keys(n);
  for (std::size_t i = 0; i < n; ++i)
    keys[i] = instance_key(candidates[i]->location);
  const auto at = [&](InstanceKey key, auto&& set) {
    for (std::size_t i = 0; i < n; ++i) {
      if (keys[i] == key)
        set(i);
    }
  };
  if (I.svc.kv_index != nullptr && !h.empty()) {
    // (Pairs, not bindings: a lambda may not capture a structured binding
    // in every compiler pdgate builds with.)
    for (const auto& match :
         I.svc.kv_index->prefix_matches(h, steady_ms(Clock::now()), std::max<std::size_t>(n, 1)))
      at(match.first,
         [&](std::size_t i) { out.prefix_blocks[i] = static_cast<std::int64_t>(match.second); });
  }
  if (I.svc.block_index == nullptr)
    return;
  std::optional<std::vector<std::uint32_t>> owned;
  const std::vector<std::uint32_t>* ids = ctx.token_ids;
  if (ids == nullptr && I.svc.tokenizer != nullptr) {
    owned = I.svc.tokenizer->token_ids(ctx.is_chat, ctx.prompt_raw);
    if (owned)
      ids = &*owned;
  }
  if (ids == nullptr || ids->empty())
    return;
  for (const auto& row : I.svc.block_index->cached_tokens(*ids, ctx.model)) {
    if (row.exact)
      at(row.key,
         [&](std::size_t i) { out.exact_tokens[i] = static_cast<std::int64_t>(row.tokens); });
  }
}

void LuaVm::drop_vars(std::uint64_t serial) {
  detail::drop_vars(*impl_, serial);
}

bool LuaVm::has_on_request() const {
  return impl_->request_ref != LUA_NOREF;
}

bool LuaVm::fail_closed(Stage s) const {
  return impl_->stages[static_cast<int>(s)].fail_closed;
}

PolicyCounters& LuaVm::counters(int where) {
  const int stage = where == kRequestHook ? static_cast<int>(Stage::decode) : where;
  return *impl_->stages[static_cast<std::size_t>(stage)].counters;
}

HookAnswer LuaVm::on_request(const RequestHookInput& in, RequestDecision& out,
                             PrefixHashCache& hashes) {
  Impl& I = *impl_;
  HookAnswer a;
  if (I.request_ref == LUA_NOREF)
    return a;
  lua_State* L = I.L;
  const int base = lua_gettop(L);
  // The pdgate.* helpers that read the request (prefix_hashes,
  // conversation) see it as a decode pick would.
  PickContext ctx;
  ctx.stage = Stage::decode;
  ctx.model = in.model;
  ctx.stream = in.stream;
  ctx.is_chat = in.is_chat;
  ctx.request_id = in.request_id;
  ctx.prompt_raw = raw_member(in.body, *in.index, in.is_chat ? "messages" : "prompt").value_or("");
  ctx.for_each_header = in.for_each_header;
  ctx.header_source = in.header_source;
  ctx.key = in.key;
  ctx.serial = in.serial;
  CallScope scope(I, ctx, hashes, 0);
  I.cur_where = kRequestHook;
  I.cur_hook = &in;
  I.cur_decision = &out;
  struct Clear {
    Impl& I;
    ~Clear() {
      I.cur_hook = nullptr;
      I.cur_decision = nullptr;
    }
  } clear{I};
  // The req handle is built under protection, as a pick's arguments are.
  if (auto err = detail::run_protected(L, [&](lua_State* S) {
        detail::push_request_handle(I);
        lua_rawseti(S, LUA_REGISTRYINDEX, I.arg_ref);
      })) {
    a.status = HookStatus::error;
    a.error = std::move(*err);
    lua_settop(L, base);
    return a;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.request_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.arg_ref);
  const int status = budgeted_call(I, 1, 4, I.svc.budget);
  release_arg(I);
  if (status != 0) {
    a.status = I.timed_out ? HookStatus::budget : HookStatus::error;
    a.error = pop_call_error(I);
    lua_settop(L, base);
    return a;
  }
  // Nothing: go on. A status, a message and headers: answer with them
  // (`nil, status, ...` as a pick refuses is read the same).
  const int first = lua_gettop(L) - 3;
  const int t = lua_type(L, first);
  const int at = t == LUA_TNIL && lua_type(L, first + 1) == LUA_TNUMBER ? first + 1 : first;
  if (t == LUA_TNIL && at == first) {
    a.status = HookStatus::accepted;
  } else if (lua_type(L, at) == LUA_TNUMBER) {
    if (auto err = read_refusal(L, at, out.reject_status, out.reject_message, out.reject_headers,
                                a.error)) {
      a.status = HookStatus::invalid;
      a.error = "on_request returned " + *err;
      out.reject_status = 0;
    } else {
      a.status = HookStatus::rejected;
    }
  } else {
    a.status = HookStatus::invalid;
    a.error = std::string("on_request returned a ") + lua_typename(L, t) +
              " (expected nothing, or a status 400..599 and a message)";
  }
  lua_settop(L, base);
  return a;
}

Result<bool> LuaVm::self_check() {
  // Ids far above any real one, so shared state the check touches cannot
  // be mistaken for a real instance's.
  constexpr std::uint64_t kFakeBase = std::uint64_t{1} << 50;
  const std::string prompt(1500, 'x');
  PrefixHashCache hashes;
  impl_->checking = true;
  struct Unset {
    bool& flag;
    ~Unset() { flag = false; }
  } unset{impl_->checking};
  for (const Stage s : {Stage::encode, Stage::prefill, Stage::decode}) {
    std::vector<InstancePtr> fake;
    for (int i = 0; i < 3; ++i) {
      UpstreamSpec spec;
      spec.role = s == Stage::prefill  ? Role::prefill
                  : s == Stage::encode ? Role::encode
                                       : Role::decode;
      spec.host = "self-check.invalid";
      spec.port = static_cast<std::uint16_t>(9000 + i);
      spec.url = "http://self-check.invalid:" + std::to_string(spec.port);
      fake.push_back(
          std::make_shared<Instance>(kFakeBase + static_cast<std::uint64_t>(s) * 8 + i, spec));
    }
    PickContext ctx;
    ctx.stage = s;
    ctx.model = "self-check";
    ctx.is_chat = true;
    ctx.prompt_raw = prompt;
    ctx.conversation_id = "self-check";
    ctx.request_id = "self-check";
    if (s == Stage::decode)
      ctx.chosen_prefill = fake[0].get();
    const PickAnswer a = pick(fake, ctx, hashes);
    const std::string& origin = impl_->stages[static_cast<int>(s)].origin;
    if (a.status != PickStatus::chosen && a.status != PickStatus::declined &&
        a.status != PickStatus::rejected && a.status != PickStatus::recheck) {
      return fail("policy " + origin + " failed its self-check (" + to_string(s) +
                  " pick on 3 instances): " + to_string(a.status) + ": " + a.error);
    }
    if (a.status == PickStatus::chosen) {
      PickOutcome o;
      o.stage = s;
      o.ok = true;
      o.status = 200;
      if (auto err = on_complete(*fake[a.index], ctx, o, hashes)) {
        return fail("policy " + origin + " failed its self-check (" + to_string(s) +
                    " on_complete): " + *err);
      }
    }
  }
  if (has_on_request()) {
    static constexpr std::string_view kBody =
        R"({"model":"self-check","messages":[{"role":"user","content":"self-check"}],)"
        R"("max_tokens":16})";
    auto index = index_json_object(kBody);
    ClientKey key;
    key.name = "self-check";
    RequestHookInput in;
    in.request_id = "self-check";
    in.body = kBody;
    in.index = &*index;
    in.is_chat = true;
    in.model = "self-check";
    in.prompt_bytes = 44;
    in.key = &key;
    RequestDecision d;
    const HookAnswer a = on_request(in, d, hashes);
    if (a.status != HookStatus::accepted && a.status != HookStatus::rejected) {
      return fail("policy " + impl_->stages[static_cast<int>(Stage::decode)].origin +
                  " failed its self-check (on_request): " + to_string(a.status) + ": " + a.error);
    }
  }
  // The caches must not keep the fake instances alive as the last ones seen.
  for (auto& c : impl_->caches) {
    luaL_unref(impl_->L, LUA_REGISTRYINDEX, c.array_ref);
    c.array_ref = LUA_NOREF;
    c.ptrs.clear();
    c.ids.clear();
    c.keys.clear();
    c.versions.clear();
  }
  return true;
}

}  // namespace pdgate::policy
