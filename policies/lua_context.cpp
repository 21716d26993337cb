// The tables a stage's hooks are given: ctx (the request, its fields
// pushed when a script first reads them), the instances array (kept in
// the state between picks, only changed numbers rewritten), and for
// on_complete the chosen instance and the outcome. This is the pick
// path's marshalling: what it costs, every pick pays.
#include <algorithm>
#include <iterator>

#include "core/upstream/load_model.hpp"
#include "policies/detail/lua_bindings.hpp"
#include "policies/detail/lua_state.hpp"

namespace pdgate::policy::detail {
namespace {

void set_number(lua_State* L, const char* k, double v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}
void set_bool(lua_State* L, const char* k, bool v) {
  lua_pushboolean(L, v ? 1 : 0);
  lua_setfield(L, -2, k);
}
void set_string(lua_State* L, const char* k, std::string_view v) {
  lua_pushlstring(L, v.data(), v.size());
  lua_setfield(L, -2, k);
}

// The fields of ctx, each pushed from the request only when a script
// first reads it (then kept in the table for the rest of the call): most
// policies read one or two of them, and pushing all of them (interning a
// fresh request id string every time) was half the cost of a pick.
constexpr const char* kCtxFields[] = {
    "stage",      "model",      "stream",    "is_chat",   "prompt_len", "conversation_id",
    "request_id", "prefill",    "headers",   "key",       "attempt",    "failed",
    "vars",       "migrations", "rechecked", "recheck_ms"};

// ctx.failed: {id, url, role, kind, status, labels} of the stage's last
// failed attempt, or nil before any failed.
void push_failed(lua_State* L, const PickContext& ctx) {
  const auto s = static_cast<std::size_t>(ctx.stage);
  if (ctx.retries == nullptr || !ctx.retries->last[s] || !ctx.retries->last[s]->instance) {
    lua_pushnil(L);
    return;
  }
  const PickFailure& f = *ctx.retries->last[s];
  const Instance& inst = *f.instance;
  lua_createtable(L, 0, 6);
  set_number(L, "id", static_cast<double>(inst.id));
  set_string(L, "url", inst.spec.url);
  set_string(L, "role", pdgate::to_string(inst.spec.role));
  set_string(L, "kind", f.kind);
  set_number(L, "status", f.status);
  const auto labels = inst.labels();
  lua_createtable(L, 0, static_cast<int>(labels->size()));
  for (const auto& [k, v] : *labels)
    set_string(L, k.c_str(), v);
  lua_setfield(L, -2, "labels");
}

// Pushes field `i` of kCtxFields for `ctx` (nil when it has no value).
void push_ctx_field(Impl& I, lua_State* L, const PickContext& ctx, int i) {
  switch (i) {
    case 0:
      lua_pushstring(L, pdgate::to_string(ctx.stage));
      return;
    case 1:
      lua_pushlstring(L, ctx.model.data(), ctx.model.size());
      return;
    case 2:
      lua_pushboolean(L, ctx.stream ? 1 : 0);
      return;
    case 3:
      lua_pushboolean(L, ctx.is_chat ? 1 : 0);
      return;
    case 4:
      lua_pushnumber(L, static_cast<double>(ctx.prompt_raw.size()));
      return;
    case 5:
      if (ctx.conversation_id)
        lua_pushlstring(L, ctx.conversation_id->data(), ctx.conversation_id->size());
      else
        lua_pushnil(L);
      return;
    case 6:
      lua_pushlstring(L, ctx.request_id.data(), ctx.request_id.size());
      return;
    case 7:
      if (ctx.chosen_prefill != nullptr)
        lua_pushnumber(L, static_cast<double>(ctx.chosen_prefill->id));
      else
        lua_pushnil(L);
      return;
    case 8:
      lua_createtable(L, 0, static_cast<int>(std::max<std::size_t>(ctx.headers.size(), 8)));
      if (!ctx.headers.empty()) {
        for (const auto& [k, v] : ctx.headers) {
          lua_pushlstring(L, k.data(), k.size());
          lua_pushlstring(L, v.data(), v.size());
          lua_rawset(L, -3);
        }
      } else if (ctx.for_each_header != nullptr) {
        ctx.for_each_header(ctx.header_source, L, &add_header);
      }
      return;
    case 9:
      push_client_key(L, ctx.key);
      return;
    case 10:
      lua_pushnumber(
          L, ctx.retries == nullptr
                 ? 1.0
                 : static_cast<double>(
                       ctx.retries->failed_attempts[static_cast<std::size_t>(ctx.stage)] + 1));
      return;
    case 11:
      push_failed(L, ctx);
      return;
    case 12:
      push_vars(I, ctx.serial);
      return;
    case 13:
      lua_pushnumber(L, static_cast<double>(ctx.migrations));
      return;
    case 14:
      lua_pushboolean(L, ctx.rechecked ? 1 : 0);
      return;
    case 15:
      lua_pushnumber(L, static_cast<double>(ctx.recheck_wait.count()));
      return;
    default:
      lua_pushnil(L);
  }
}

// __index of the ctx table: fills a field from the request the first time
// a script reads it during a call.
int ctx_index(lua_State* L) {
  auto* I = static_cast<Impl*>(lua_touserdata(L, lua_upvalueindex(1)));
  std::size_t n = 0;
  const char* key = lua_tolstring(L, 2, &n);
  const PickContext* ctx = I->cur_ctx;
  if (key == nullptr || ctx == nullptr) {
    lua_pushnil(L);
    return 1;
  }
  const std::string_view k(key, n);
  for (int i = 0; i < static_cast<int>(std::size(kCtxFields)); ++i) {
    if (k != kCtxFields[i])
      continue;
    push_ctx_field(*I, L, *ctx, i);
    if (!lua_isnil(L, -1)) {
      lua_pushvalue(L, -1);
      lua_setfield(L, 1, kCtxFields[i]);
      I->ctx_filled |= 1u << i;
    }
    return 1;
  }
  lua_pushnil(L);
  return 1;
}

}  // namespace

void create_context_tables(Impl& I) {
  lua_State* L = I.L;
  lua_createtable(L, 0, 12);
  lua_createtable(L, 0, 2);
  lua_pushlightuserdata(L, &I);
  lua_pushcclosure(L, ctx_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pushboolean(L, 0);  // scripts cannot read or replace it
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
  I.ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_createtable(L, 0, 6);
  I.outcome_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_newtable(L);
  I.empty_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushboolean(L, 0);
  I.arg_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

// Pushes the stage's instances array, rebuilding it when the candidate
// list changed and refreshing the numbers that changed since last time.
void push_instances(Impl& I, Stage stage, const std::vector<InstancePtr>& candidates,
                    std::int64_t now_ms) {
  lua_State* L = I.L;
  auto& c = I.caches[static_cast<int>(stage)];
  // Pointer and id both: a freed instance's address may be reused.
  bool same = c.array_ref != LUA_NOREF && c.ptrs.size() == candidates.size();
  for (std::size_t i = 0; same && i < candidates.size(); ++i) {
    same = c.ptrs[i] == candidates[i].get() && c.ids[i] == candidates[i]->id &&
           c.versions[i] == candidates[i]->meta_version();
  }
  if (!same) {
    // Unset first: should the rebuild fail (the state at its memory cap),
    // the next pick finds no array and rebuilds it.
    luaL_unref(L, LUA_REGISTRYINDEX, c.array_ref);
    c.array_ref = LUA_NOREF;
    c.ptrs.clear();
    c.ids.clear();
    c.keys.clear();
    c.versions.clear();
    c.shadow.assign(candidates.size(), Impl::Shadow{});
    lua_createtable(L, static_cast<int>(candidates.size()), 0);
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      const Instance& inst = *candidates[i];
      c.ptrs.push_back(&inst);
      c.ids.push_back(inst.id);
      c.keys.push_back(instance_key(inst.location));
      c.versions.push_back(inst.meta_version());
      lua_createtable(L, 0, 16);
      set_number(L, "id", static_cast<double>(inst.id));
      set_number(L, "index", static_cast<double>(i + 1));
      set_string(L, "url", inst.spec.url);
      // A data-parallel rank: which one, and how many the engine has.
      if (inst.spec.dp_rank) {
        set_number(L, "dp_rank", *inst.spec.dp_rank);
        set_number(L, "dp_size", inst.spec.dp_size);
      }
      set_string(L, "host", inst.spec.host);
      set_number(L, "port", inst.spec.port);
      set_string(L, "role", pdgate::to_string(inst.spec.role));
      set_number(L, "weight", inst.weight());
      // Labels given when the instance was added (or PATCHed) through the
      // admin API.
      const auto labels = inst.labels();
      lua_createtable(L, 0, static_cast<int>(labels->size()));
      for (const auto& [k, v] : *labels)
        set_string(L, k.c_str(), v);
      lua_setfield(L, -2, "labels");
      lua_rawseti(L, -2, static_cast<int>(i + 1));
    }
    c.array_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, c.array_ref);
  for (std::size_t i = 0; i < c.ptrs.size(); ++i) {
    const Instance& inst = *c.ptrs[i];
    // The common case, nothing changed, costs three relaxed loads and a
    // compare; the engine metrics are re-read only after a new scrape.
    Impl::Shadow& old = c.shadow[i];
    const std::int64_t in_flight = inst.in_flight.load(std::memory_order_relaxed);
    const std::int64_t others = inst.others_in_flight.load(std::memory_order_relaxed);
    const std::int64_t queued = inst.cluster_queued_tokens();
    const double per_token = inst.prefill_ms_per_token.load(std::memory_order_relaxed);
    const bool healthy = inst.healthy.load(std::memory_order_relaxed);
    const std::int64_t at = inst.metrics_at_ms.load(std::memory_order_relaxed);
    // Numbers older than this describe a past the policy should not trust.
    const bool fresh = at != 0 && now_ms - at < kEngineMetricsFreshMs;
    if (old.valid && in_flight == old.in_flight && others == old.others_in_flight &&
        queued == old.queued_tokens && per_token == old.ms_per_token && healthy == old.healthy &&
        at == old.metrics_at && fresh == old.has_metrics)
      continue;
    Impl::Shadow now{in_flight, others, queued, per_token, at, healthy, fresh, true};
    lua_rawgeti(L, -1, static_cast<int>(i + 1));
    if (!old.valid || in_flight != old.in_flight)
      set_number(L, "in_flight", static_cast<double>(in_flight));
    if (!old.valid || in_flight != old.in_flight || others != old.others_in_flight)
      set_number(L, "cluster_in_flight", static_cast<double>(in_flight + others));
    if (!old.valid || queued != old.queued_tokens)
      set_number(L, "queued_tokens", static_cast<double>(queued));
    if (!old.valid || per_token != old.ms_per_token)
      set_number(L, "prefill_ms_per_token", per_token);
    if (!old.valid || healthy != old.healthy)
      set_bool(L, "healthy", healthy);
    if (!old.valid || fresh != old.has_metrics)
      set_bool(L, "has_metrics", fresh);
    if (!old.valid || at != old.metrics_at) {
      set_number(L, "running",
                 static_cast<double>(inst.engine_running.load(std::memory_order_relaxed)));
      set_number(L, "waiting",
                 static_cast<double>(inst.engine_waiting.load(std::memory_order_relaxed)));
      set_number(L, "kv_usage", inst.kv_cache_usage.load(std::memory_order_relaxed));
      set_number(L, "other_load",
                 static_cast<double>(inst.engine_other_load.load(std::memory_order_relaxed)));
    }
    lua_pop(L, 1);
    old = now;
  }
}

void add_header(void* L_, std::string_view name, std::string_view value) {
  auto* L = static_cast<lua_State*>(L_);
  lua_pushlstring(L, name.data(), name.size());
  lua_pushlstring(L, value.data(), value.size());
  lua_rawset(L, -3);
}

// {name = ..., labels = {...}} of the client's API key, or nil.
void push_client_key(lua_State* L, const ClientKey* key) {
  if (key == nullptr) {
    lua_pushnil(L);
    return;
  }
  lua_createtable(L, 0, 2);
  lua_pushlstring(L, key->name.data(), key->name.size());
  lua_setfield(L, -2, "name");
  lua_createtable(L, 0, static_cast<int>(key->labels.size()));
  for (const auto& [k, v] : key->labels) {
    lua_pushlstring(L, v.data(), v.size());
    lua_setfield(L, -2, k.c_str());
  }
  lua_setfield(L, -2, "labels");
}

// Pushes the reused ctx table, emptied of the previous call's fields. The
// table is only valid during the call: scripts copy what they keep
// (docs/policies.md).
void push_ctx(Impl& I, const PickContext& ctx) {
  (void)ctx;  // read through ctx_index, from I.cur_ctx
  lua_State* L = I.L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.ctx_ref);
  for (int i = 0; I.ctx_filled != 0; ++i) {
    if ((I.ctx_filled & (1u << i)) == 0)
      continue;
    lua_pushnil(L);
    lua_setfield(L, -2, kCtxFields[i]);
    I.ctx_filled &= ~(1u << i);
  }
}

void push_vars(Impl& I, std::uint64_t serial) {
  lua_State* L = I.L;
  if (serial == 0) {  // a request without a serial (the self-check): its own table
    lua_newtable(L);
    return;
  }
  if (I.vars_ref == LUA_NOREF) {
    lua_newtable(L);
    I.vars_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.vars_ref);
  lua_pushnumber(L, static_cast<double>(serial));
  lua_rawget(L, -2);
  if (!lua_isnil(L, -1)) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 1);
  lua_newtable(L);
  lua_pushnumber(L, static_cast<double>(serial));
  lua_pushvalue(L, -2);
  lua_rawset(L, -4);
  I.vars_order.push_back(serial);
  if (I.vars_order.size() > Impl::kMaxVars) {
    lua_pushnumber(L, static_cast<double>(I.vars_order.front()));
    lua_pushnil(L);
    lua_rawset(L, -4);
    I.vars_order.pop_front();
  }
  lua_remove(L, -2);
}

void drop_vars(Impl& I, std::uint64_t serial) {
  if (I.vars_ref == LUA_NOREF || serial == 0)
    return;
  lua_State* L = I.L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.vars_ref);
  lua_pushnumber(L, static_cast<double>(serial));
  lua_pushnil(L);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  // The order list keeps the serial until it is the oldest: dropping a
  // table that is gone already costs nothing.
}

void push_chosen_instance(Impl& I, Stage stage, const Instance& chosen) {
  lua_State* L = I.L;
  // The instance's table from the stage cache when it is still there, so
  // a policy may key state by the table; a fresh one otherwise.
  const auto& c = I.caches[static_cast<int>(stage)];
  const auto it = std::find(c.ptrs.begin(), c.ptrs.end(), &chosen);
  if (it != c.ptrs.end() && c.ids[static_cast<std::size_t>(it - c.ptrs.begin())] == chosen.id) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, c.array_ref);
    lua_rawgeti(L, -1, static_cast<int>(it - c.ptrs.begin() + 1));
    lua_remove(L, -2);
  } else {
    lua_createtable(L, 0, 4);
    set_number(L, "id", static_cast<double>(chosen.id));
    set_string(L, "url", chosen.spec.url);
    set_string(L, "role", pdgate::to_string(chosen.spec.role));
  }
}

void push_outcome(Impl& I, const PickOutcome& outcome) {
  lua_State* L = I.L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.outcome_ref);
  set_bool(L, "ok", outcome.ok);
  set_number(L, "status", outcome.status);
  const double ttft_ms = static_cast<double>(outcome.time_to_first_token.count()) / 1000.0;
  set_number(L, "ttft_ms", ttft_ms);
  set_number(L, "header_ms", static_cast<double>(outcome.time_to_header.count()) / 1000.0);
  // The old name, documented as the time to first token: policies written
  // against it now get what it promised.
  set_number(L, "ttfb_ms", ttft_ms);
  set_number(L, "total_ms", static_cast<double>(outcome.total.count()) / 1000.0);
  lua_pushstring(L, pdgate::to_string(outcome.stage));
  lua_setfield(L, -2, "stage");
}

}  // namespace pdgate::policy::detail
