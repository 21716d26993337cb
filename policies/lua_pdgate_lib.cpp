// The `pdgate` module scripts call (docs/policies.md): the prompt's
// prefix hashes and where they were routed, the engines' cached tokens,
// conversations, loads, the shared key-value store, hashing, the clock,
// and the policy's own counters and log. Each function reads the request
// being handled from the VM's state (lua_state.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include <spdlog/spdlog.h>

#include "core/routing/request_hook.hpp"
#include "core/upstream/load_model.hpp"
#include "policies/detail/lua_bindings.hpp"
#include "policies/detail/lua_sandbox.hpp"
#include "policies/detail/lua_state.hpp"
#include "policies/prefix_hash.hpp"

namespace pdgate::policy::detail {
namespace {

Impl& in_request(lua_State* L, const char* fn) {
  Impl& I = impl_of(L);
  if (I.cur_ctx == nullptr)
    luaL_error(L, "pdgate.%s: only callable inside pick, on_complete or on_request", fn);
  return I;
}

std::int64_t prompt_tokens(const Impl& I) {
  return pdgate::prompt_tokens(*I.cur_ctx);
}

// A lookup found `tokens` of the prompt cached on candidate `i` (0-based):
// kept for the pick's answer (the queue the request adds there) and for
// pdgate.predicted_ttft's default.
void note_cached(Impl& I, std::size_t i, std::int64_t tokens) {
  if (I.cur_cached.size() != I.cur_candidates)
    I.cur_cached.assign(I.cur_candidates, 0);
  if (i < I.cur_cached.size())
    I.cur_cached[i] = std::max(I.cur_cached[i], std::min(tokens, prompt_tokens(I)));
}

int l_prefix_hashes(lua_State* L) {
  Impl& I = in_request(L, "prefix_hashes");
  const auto& h = I.hashes();
  lua_createtable(L, static_cast<int>(h.size()), 0);
  for (std::size_t i = 0; i < h.size(); ++i) {
    lua_pushnumber(L, static_cast<double>(h[i]));
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 1;
}

// pdgate.prefix_matches() -> { [position in instances] = leading blocks
// of this prompt recently routed there }, the prompt's block count. Only
// candidates of this pick appear, keyed by position so a script indexes
// `instances` directly instead of scanning it.
int l_prefix_matches(lua_State* L) {
  Impl& I = in_request(L, "prefix_matches");
  if (I.cur_list == nullptr)
    luaL_error(L, "pdgate.prefix_matches: only callable inside pick");
  const auto& h = I.hashes();
  // The stage cache lists this pick's candidates in order (push_instances).
  const auto& keys = I.caches[static_cast<int>(I.cur_ctx->stage)].keys;
  const auto m = I.svc.kv_index->prefix_matches(h, steady_ms(Clock::now()),
                                                std::max<std::size_t>(keys.size(), 1));
  lua_createtable(L, 0, static_cast<int>(m.size()));
  for (const auto& [key, blocks] : m) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] != key)
        continue;
      lua_pushnumber(L, static_cast<double>(blocks));
      lua_rawseti(L, -2, static_cast<int>(i + 1));
      note_cached(
          I, i,
          static_cast<std::int64_t>(estimated_prompt_tokens(blocks * I.svc.prefix_block_bytes)));
      break;
    }
  }
  lua_pushinteger(L, static_cast<lua_Integer>(h.size()));
  return 2;
}

// pdgate.cached_tokens() -> { [position in instances] = leading prompt
// tokens that instance's engine holds, exactly, by its KV events }, the
// prompt's token count. Candidates without exact data (no event feed, or
// one in fallback) are absent: a policy uses prefix_matches() for them.
// Nothing when no tokenizer is configured or the prompt cannot be read.
int l_cached_tokens(lua_State* L) {
  Impl& I = in_request(L, "cached_tokens");
  if (I.cur_list == nullptr)
    luaL_error(L, "pdgate.cached_tokens: only callable inside pick");
  if (I.svc.block_index == nullptr)
    return 0;
  // An engine's own tokens (--tokenizer vllm, read before routing), else
  // the configured rule's.
  std::optional<std::vector<std::uint32_t>> owned;
  const std::vector<std::uint32_t>* ids = I.cur_ctx->token_ids;
  if (ids == nullptr && I.svc.tokenizer != nullptr) {
    owned = I.svc.tokenizer->token_ids(I.cur_ctx->is_chat, I.cur_ctx->prompt_raw);
    if (owned)
      ids = &*owned;
  }
  if (ids == nullptr || ids->empty())
    return 0;
  const auto& keys = I.caches[static_cast<int>(I.cur_ctx->stage)].keys;
  // The request's model: a LoRA adapter's name matches only its blocks.
  const auto rows = I.svc.block_index->cached_tokens(*ids, I.cur_ctx->model);
  lua_createtable(L, 0, static_cast<int>(keys.size()));
  for (const auto& row : rows) {
    if (!row.exact)
      continue;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == row.key) {
        lua_pushnumber(L, static_cast<double>(row.tokens));
        lua_rawseti(L, -2, static_cast<int>(i + 1));
        note_cached(I, i, static_cast<std::int64_t>(row.tokens));
        break;
      }
    }
  }
  lua_pushinteger(L, static_cast<lua_Integer>(ids->size()));
  return 2;
}

// pdgate.prefix_held(stage) -> the most leading blocks of this prompt
// any one of the stage's instances recently received, and the prompt's
// block count. The instances are those the stage last offered to a pick
// on this worker, so the request hook can ask before any pick of its own
// (conditional_pd: is decode already holding most of the prompt?).
int l_prefix_held(lua_State* L) {
  Impl& I = in_request(L, "prefix_held");
  const char* name = luaL_checkstring(L, 1);
  int stage = -1;
  for (const Stage s : {Stage::encode, Stage::prefill, Stage::decode}) {
    if (std::strcmp(name, pdgate::to_string(s)) == 0)
      stage = static_cast<int>(s);
  }
  if (stage < 0)
    return luaL_argerror(L, 1, "\"prefill\", \"decode\" or \"encode\" expected");
  const auto& h = I.hashes();
  const auto& keys = I.caches[static_cast<std::size_t>(stage)].keys;
  std::size_t best = 0;
  if (!keys.empty()) {
    for (const auto& [key, blocks] :
         I.svc.kv_index->prefix_matches(h, steady_ms(Clock::now()), keys.size())) {
      if (blocks > best && std::find(keys.begin(), keys.end(), key) != keys.end())
        best = blocks;
    }
  }
  lua_pushnumber(L, static_cast<double>(best));
  lua_pushnumber(L, static_cast<double>(h.size()));
  return 2;
}

std::optional<std::uint64_t> local_id(const Impl& I, Stage stage, InstanceKey key) {
  if (key == 0)
    return std::nullopt;
  const auto& c = I.caches[static_cast<int>(stage)];
  for (std::size_t i = 0; i < c.keys.size(); ++i) {
    if (c.keys[i] == key)
      return c.ids[i];
  }
  return std::nullopt;
}

int l_conversation(lua_State* L) {
  Impl& I = in_request(L, "conversation");
  if (!I.cur_ctx->conversation_id)
    return 0;
  const auto e = I.svc.kv_index->conversation(*I.cur_ctx->conversation_id);
  if (!e)
    return 0;
  lua_createtable(L, 0, 3);
  // The route names instances by key (the same on every replica); scripts
  // compare this replica's ids, so each key is looked up among the
  // instances the stage last offered. One not there (removed, or never
  // offered to this worker) is left out, as if unknown.
  if (const auto id = local_id(I, Stage::decode, e->decode)) {
    lua_pushnumber(L, static_cast<double>(*id));
    lua_setfield(L, -2, "decode");
  }
  if (const auto id = local_id(I, Stage::prefill, e->prefill)) {
    lua_pushnumber(L, static_cast<double>(*id));
    lua_setfield(L, -2, "prefill");
  }
  lua_pushnumber(L, static_cast<double>(steady_ms(Clock::now()) - e->at_ms));
  lua_setfield(L, -2, "age_ms");
  return 1;
}

// The healthy candidate of the current pick with the least `cost`,
// scanning from position `start` (1-based; ties go to the first scanned);
// `seen` sees every healthy candidate's cost. Returns the list's size when
// none is healthy.
template <typename Cost, typename Seen>
std::size_t scan_least(const std::vector<InstancePtr>& list, std::size_t start, Cost cost,
                       Seen seen, decltype(cost(*list[0]))& best_value) {
  const std::size_t n = list.size();
  std::size_t best = n;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = (start - 1 + k) % n;
    const Instance& inst = *list[i];
    if (!inst.healthy.load(std::memory_order_relaxed))
      continue;
    const auto v = cost(inst);
    seen(v);
    if (best == n || v < best_value) {
      best = i;
      best_value = v;
    }
  }
  return best;
}

// Pushes the instance table at position `best` (0-based) of the pick.
void push_candidate(lua_State* L, Impl& I, std::size_t best) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.caches[static_cast<int>(I.cur_ctx->stage)].array_ref);
  lua_rawgeti(L, -1, static_cast<int>(best + 1));
  lua_remove(L, -2);
}

std::size_t scan_start(lua_State* L) {
  return static_cast<std::size_t>(std::max<lua_Number>(luaL_optnumber(L, 1, 1), 1));
}

// pdgate.least_loaded([start]) -> instance, its load, the highest load.
// The scan least_load.lua would do, over the C++ instances instead of the
// Lua tables: 256 instances take under 1 us here, ~5 us interpreted.
// Ties go to the first in scan order, which begins at position `start`.
int l_least_loaded(lua_State* L) {
  Impl& I = impl_of(L);
  if (I.cur_list == nullptr)
    luaL_error(L, "pdgate.least_loaded: only callable inside pick");
  std::int64_t best_load = 0, max_load = -1;
  const std::size_t best = scan_least(
      *I.cur_list, scan_start(L),
      [&](const Instance& inst) { return routing_load(inst, I.cur_now_ms); },
      [&](std::int64_t l) { max_load = std::max(max_load, l); }, best_load);
  if (best == I.cur_list->size())
    return 0;
  push_candidate(L, I, best);
  lua_pushnumber(L, static_cast<double>(best_load));
  lua_pushnumber(L, static_cast<double>(max_load));
  return 3;
}

// pdgate.load(instance) -> the instance's load as least_loaded counts it
// (core/upstream/load_model.hpp), from its Lua table: cluster_in_flight,
// plus other_load when has_metrics.
int l_load(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "cluster_in_flight");
  if (lua_isnil(L, -1)) {  // a table a script made: its own count
    lua_pop(L, 1);
    lua_getfield(L, 1, "in_flight");
  }
  lua_Number l = lua_tonumber(L, -1);
  lua_getfield(L, 1, "has_metrics");
  if (lua_toboolean(L, -1)) {
    lua_getfield(L, 1, "other_load");
    l += lua_tonumber(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 2);
  lua_pushnumber(L, l);
  return 1;
}

double fleet_cost(Impl& I) {
  if (I.cur_fleet_cost < 0)
    I.cur_fleet_cost = fleet_ms_per_token(*I.cur_list);
  return I.cur_fleet_cost;
}

// The C++ instance behind one of this pick's instance tables (its
// `index`), or an error.
const Instance& pick_instance(lua_State* L, Impl& I, int arg, const char* fn, std::size_t& pos) {
  luaL_checktype(L, arg, LUA_TTABLE);
  lua_getfield(L, arg, "index");
  const lua_Number d = lua_tonumber(L, -1);
  lua_pop(L, 1);
  if (!(d >= 1 && d <= static_cast<lua_Number>(I.cur_list->size()) && d == std::floor(d)))
    luaL_error(L, "pdgate.%s: not one of this pick's instances", fn);
  pos = static_cast<std::size_t>(d) - 1;
  return *(*I.cur_list)[pos];
}

// pdgate.predicted_ttft(instance [, cached_tokens]) -> milliseconds to the
// prompt's first token there: the prompt tokens queued on that engine by
// every replica, then this prompt's uncached ones, at the engine's learnt
// cost per token (core/upstream/load_model.hpp); and what the cached part
// is worth (its tokens at the fleet's cost per token). cached_tokens
// defaults to what this pick's prefix_matches / cached_tokens calls found
// there.
int l_predicted_ttft(lua_State* L) {
  Impl& I = impl_of(L);
  if (I.cur_list == nullptr)
    luaL_error(L, "pdgate.predicted_ttft: only callable inside pick");
  std::size_t pos = 0;
  const Instance& inst = pick_instance(L, I, 1, "predicted_ttft", pos);
  std::int64_t cached = 0;
  if (lua_isnoneornil(L, 2)) {
    cached = pos < I.cur_cached.size() ? I.cur_cached[pos] : 0;
  } else {
    const lua_Number c = luaL_checknumber(L, 2);
    cached = c > 0 ? static_cast<std::int64_t>(std::min<lua_Number>(c, 1e15)) : 0;
  }
  const std::int64_t prompt = prompt_tokens(I);
  cached = std::min(cached, prompt);
  const double fleet = fleet_cost(I);
  lua_pushnumber(L, predicted_ttft_ms(inst, prompt - cached, fleet, I.cur_now_ms));
  lua_pushnumber(L, cached_worth_ms(cached, fleet));
  return 2;
}

// pdgate.least_cost([start]) -> the healthy instance where this prompt,
// computed in full, would get its first token soonest, and that time (ms).
// Ties go to the prompt's home among them (load_model.hpp, home_among),
// so replicas routing the same new prefix at the same moment agree;
// `start` orders the scan only for a prompt with no text to key by.
int l_least_cost(lua_State* L) {
  Impl& I = impl_of(L);
  if (I.cur_list == nullptr)
    luaL_error(L, "pdgate.least_cost: only callable inside pick");
  const auto& list = *I.cur_list;
  const std::int64_t tokens = prompt_tokens(I);
  const double fleet = fleet_cost(I);
  const auto cost = [&](const Instance& inst) {
    return predicted_ttft_ms(inst, tokens, fleet, I.cur_now_ms);
  };
  const auto& keys = I.caches[static_cast<int>(I.cur_ctx->stage)].keys;
  std::size_t best = list.size();
  double best_ms = 0;
  if (I.cur_ctx->prompt_raw.empty() || keys.size() != list.size()) {
    best = scan_least(
        list, scan_start(L), cost, [](double) {}, best_ms);
  } else {
    auto& costs = I.cur_costs;
    costs.assign(list.size(), std::numeric_limits<double>::quiet_NaN());
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (list[i]->healthy.load(std::memory_order_relaxed))
        costs[i] = cost(*list[i]);
    }
    const double own = cached_worth_ms(tokens + kBaseTokens, fleet);
    // Prompts sharing their first kHomeBytes share a home.
    const auto key = hash64(I.cur_ctx->prompt_raw.substr(0, kHomeBytes), 0);
    best = home_among(costs, keys, key, kHomeSlack * own);
    if (best < list.size())
      best_ms = costs[best];
  }
  if (best == list.size())
    return 0;
  push_candidate(L, I, best);
  lua_pushnumber(L, best_ms);
  return 2;
}

// pdgate.prompt_tokens() -> the prompt's length in tokens (the engine's
// count with --tokenizer vllm, else an estimate of 4 bytes per token).
int l_prompt_tokens(lua_State* L) {
  Impl& I = in_request(L, "prompt_tokens");
  lua_pushnumber(L, static_cast<double>(prompt_tokens(I)));
  return 1;
}

// The longest TTL or window a script may give (a year), so that seconds
// turned into milliseconds stay far inside an int64.
constexpr double kMaxKvSeconds = 31536000;

// Runtime failures return nil, err (OpenResty style); caller mistakes raise.
int push_fail(lua_State* L, const std::string& msg) {
  lua_pushnil(L);
  lua_pushlstring(L, msg.data(), msg.size());
  return 2;
}

// A dry VM's view of a key: its own writes first, then the store.
std::optional<KvValue> dry_get(Impl& I, std::string_view key) {
  if (auto it = I.dry_kv.find(std::string(key)); it != I.dry_kv.end())
    return it->second;
  return I.svc.kv->get(key, steady_ms(Clock::now()));
}

// Keeps a dry VM's write to the store for its own later reads; false past
// the bound.
bool dry_put(Impl& I, std::string_view key, std::optional<KvValue> v) {
  std::string k(key);
  if (I.dry_kv.size() >= Impl::kMaxDryWrites && I.dry_kv.find(k) == I.dry_kv.end())
    return false;
  I.dry_kv[std::move(k)] = std::move(v);
  return true;
}

constexpr const char* kDryWritesFull = "explain: too many writes to the shared store";

int l_kv_get(lua_State* L) {
  Impl& I = impl_of(L);
  std::size_t n = 0;
  const char* k = luaL_checklstring(L, 1, &n);
  const auto v = I.dry ? dry_get(I, {k, n}) : I.svc.kv->get({k, n}, steady_ms(Clock::now()));
  if (!v)
    return 0;
  if (const auto* d = std::get_if<double>(&*v)) {
    lua_pushnumber(L, *d);
  } else if (const auto* s = std::get_if<std::string>(&*v)) {
    lua_pushlstring(L, s->data(), s->size());
  } else {
    lua_pushboolean(L, std::get<bool>(*v) ? 1 : 0);
  }
  return 1;
}

int l_kv_set(lua_State* L) {
  Impl& I = impl_of(L);
  std::size_t n = 0;
  const char* k = luaL_checklstring(L, 1, &n);
  const double ttl_s = luaL_optnumber(L, 3, 0);
  KvValue v;
  switch (lua_type(L, 2)) {
    case LUA_TNUMBER:
      v = lua_tonumber(L, 2);
      break;
    case LUA_TBOOLEAN:
      v = lua_toboolean(L, 2) != 0;
      break;
    case LUA_TSTRING: {
      std::size_t len = 0;
      const char* s = lua_tolstring(L, 2, &len);
      v = std::string(s, len);
      break;
    }
    case LUA_TNIL:
    case LUA_TNONE:
      if (I.dry) {
        if (!dry_put(I, {k, n}, std::nullopt))
          return push_fail(L, kDryWritesFull);
      } else {
        I.svc.kv->erase({k, n});
      }
      lua_pushboolean(L, 1);
      return 1;
    default:
      return luaL_argerror(L, 2, "number, string, boolean or nil expected");
  }
  if (I.dry) {
    if (!dry_put(I, {k, n}, std::move(v)))
      return push_fail(L, kDryWritesFull);
    lua_pushboolean(L, 1);
    return 1;
  }
  auto r = I.svc.kv->set({k, n}, std::move(v), static_cast<std::int64_t>(ttl_s * 1000),
                         steady_ms(Clock::now()));
  if (!r)
    return push_fail(L, r.error());
  lua_pushboolean(L, 1);
  return 1;
}

int l_kv_incr(lua_State* L) {
  Impl& I = impl_of(L);
  std::size_t n = 0;
  const char* k = luaL_checklstring(L, 1, &n);
  const double delta = luaL_optnumber(L, 2, 1);
  // A key this call creates expires after ttl seconds: a window's counter
  // in one step, with no moment where it exists without its expiry.
  const double ttl_s = luaL_optnumber(L, 3, 0);
  if (!(ttl_s >= 0 && ttl_s <= kMaxKvSeconds))
    return luaL_argerror(L, 3, "ttl must be 0..31536000 seconds");
  if (I.dry) {
    // What the increment would return, kept for this VM's later reads.
    Result<double> r = delta;
    if (auto it = I.dry_kv.find(std::string(k, n)); it != I.dry_kv.end()) {
      const double* d = it->second ? std::get_if<double>(&*it->second) : nullptr;
      if (it->second && d == nullptr)
        r = fail("value is not a number");
      else
        r = (d != nullptr ? *d : 0) + delta;
    } else {
      r = I.svc.kv->incr_peek({k, n}, delta, steady_ms(Clock::now()));
    }
    if (!r)
      return push_fail(L, r.error());
    if (!dry_put(I, {k, n}, KvValue{*r}))
      return push_fail(L, kDryWritesFull);
    lua_pushnumber(L, *r);
    return 1;
  }
  auto r = I.svc.kv->incr({k, n}, delta, steady_ms(Clock::now()),
                          static_cast<std::int64_t>(std::ceil(ttl_s * 1000)));
  if (!r)
    return push_fail(L, r.error());
  lua_pushnumber(L, *r);
  return 1;
}

// pdgate.rate(key, limit, window_seconds) -> allowed, retry_after_seconds,
// count: a sliding window of `limit` events per window under `key`, shared
// by every worker (KvStore::rate); an allowed call is counted. On a store
// failure (full): nil, err.
int l_rate(lua_State* L) {
  Impl& I = impl_of(L);
  std::size_t n = 0;
  const char* k = luaL_checklstring(L, 1, &n);
  const double limit = luaL_checknumber(L, 2);
  const double window_s = luaL_checknumber(L, 3);
  if (!(limit >= 1 && limit <= static_cast<double>(KvStore::kMaxRateLimit)) ||
      limit != std::floor(limit))
    return luaL_argerror(L, 2, "limit must be a whole number 1..100000");
  if (!(window_s > 0 && window_s <= kMaxKvSeconds))
    return luaL_argerror(L, 3, "window must be 0..31536000 seconds");
  if (I.checking) {
    // A reload's self-check on a synthetic request takes no one's slot.
    lua_pushboolean(L, 1);
    lua_pushnumber(L, 0);
    lua_pushnumber(L, 0);
    return 3;
  }
  const std::int64_t window_ms =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(window_s * 1000));
  // Explaining: the answer one more event would get, not counted.
  auto r = I.dry ? I.svc.kv->rate_peek({k, n}, static_cast<std::int64_t>(limit), window_ms,
                                       steady_ms(Clock::now()))
                 : I.svc.kv->rate({k, n}, static_cast<std::int64_t>(limit), window_ms,
                                  steady_ms(Clock::now()));
  if (!r)
    return push_fail(L, r.error());
  lua_pushboolean(L, r->allowed ? 1 : 0);
  lua_pushnumber(L, static_cast<double>(r->retry_after_ms) / 1000.0);
  lua_pushnumber(L, static_cast<double>(r->count));
  return 3;
}

// pdgate.hash(string [, seed]): seed lets rendezvous hashing score one key
// against many instances without building strings.
int l_hash(lua_State* L) {
  std::size_t n = 0;
  const char* s = luaL_checklstring(L, 1, &n);
  const auto seed = static_cast<std::uint64_t>(luaL_optnumber(L, 2, 0));
  lua_pushnumber(L, static_cast<double>(hash64({s, n}, seed) & kLuaExactMask));
  return 1;
}

int l_now_ms(lua_State* L) {
  lua_pushnumber(L, static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(
                                            Clock::now().time_since_epoch())
                                            .count()) /
                        1000.0);
  return 1;
}

// The counters of the script whose hook is running.
PolicyCounters& running_counters(lua_State* L, const char* fn) {
  Impl& I = impl_of(L);
  if (I.cur_where < 0)
    luaL_error(L, "pdgate.%s: only callable inside a hook", fn);
  const int stage = I.cur_where == kRequestHook ? static_cast<int>(Stage::decode) : I.cur_where;
  return *I.stages[static_cast<std::size_t>(stage)].counters;
}

// pdgate.count(name [, n]): adds n (default 1, a whole number >= 0) to the
// policy's counter `name`, exported as pdgate_policy_custom_total.
int l_count(lua_State* L) {
  PolicyCounters& c = running_counters(L, "count");
  std::size_t len = 0;
  const char* name = luaL_checklstring(L, 1, &len);
  const lua_Number n = luaL_optnumber(L, 2, 1);
  if (!(n >= 0 && n <= 9007199254740992.0) || n != std::floor(n))
    return luaL_argerror(L, 2, "a whole number >= 0 expected");
  // A reload's self-check on a synthetic request, or an explanation,
  // counts nothing.
  if (impl_of(L).checking || impl_of(L).dry) {
    if (auto err = PolicyCounters::name_error({name, len}))
      return push_fail(L, *err);
    lua_pushboolean(L, 1);
    return 1;
  }
  if (auto err = c.count({name, len}, static_cast<std::uint64_t>(n)))
    return push_fail(L, *err);
  lua_pushboolean(L, 1);
  return 1;
}

// pdgate.log(level, message): one log line, at most 10 per second per
// policy (bursts of 20); the others are dropped and counted. Returns
// whether the line was written.
int l_log(lua_State* L) {
  PolicyCounters& c = running_counters(L, "log");
  const char* level = luaL_checkstring(L, 1);
  std::size_t len = 0;
  const char* msg = luaL_checklstring(L, 2, &len);
  spdlog::level::level_enum lv;
  if (std::strcmp(level, "debug") == 0) {
    lv = spdlog::level::debug;
  } else if (std::strcmp(level, "info") == 0) {
    lv = spdlog::level::info;
  } else if (std::strcmp(level, "warn") == 0) {
    lv = spdlog::level::warn;
  } else if (std::strcmp(level, "error") == 0) {
    lv = spdlog::level::err;
  } else {
    return luaL_argerror(L, 1, "\"debug\", \"info\", \"warn\" or \"error\" expected");
  }
  Impl& I = impl_of(L);
  // The policy's own level (--policy-log-level) decides where it has one,
  // else the global one; a line below it is not written and takes no
  // place under the rate limit.
  const int where = I.cur_where == kRequestHook ? static_cast<int>(Stage::decode) : I.cur_where;
  const int own = I.stages[static_cast<std::size_t>(where)].log_level;
  const bool shown = own >= 0 ? static_cast<int>(lv) >= own : spdlog::should_log(lv);
  if (I.checking || (!I.dry && (!shown || !c.may_log(Clock::now())))) {
    lua_pushboolean(L, 0);
    return 1;
  }
  // Bounded, and one line: a script's text cannot forge log lines.
  std::string line(msg, std::min<std::size_t>(len, 1024));
  for (char& ch : line) {
    if (static_cast<unsigned char>(ch) < 0x20)
      ch = ' ';
  }
  if (I.dry) {
    // An explanation shows the lines, whatever the log level; the log
    // and the policy's rate limit see nothing.
    if (I.dry_log.size() >= Impl::kMaxDryLog) {
      lua_pushboolean(L, 0);
      return 1;
    }
    I.dry_log.push_back(std::string(level) + ": " + line);
    lua_pushboolean(L, 1);
    return 1;
  }
  (own >= 0 ? *I.svc.logger : *spdlog::default_logger_raw())
      .log(lv, "policy {}: {}", c.name(), line);
  lua_pushboolean(L, 1);
  return 1;
}

const luaL_Reg kPdgateLib[] = {
    {"prefix_hashes", l_prefix_hashes},
    {"prefix_matches", l_prefix_matches},
    {"cached_tokens", l_cached_tokens},
    {"prefix_held", l_prefix_held},
    {"least_loaded", l_least_loaded},
    {"load", l_load},
    {"predicted_ttft", l_predicted_ttft},
    {"least_cost", l_least_cost},
    {"prompt_tokens", l_prompt_tokens},
    {"conversation", l_conversation},
    {"kv_get", l_kv_get},
    {"kv_set", l_kv_set},
    {"kv_incr", l_kv_incr},
    {"rate", l_rate},
    {"hash", l_hash},
    {"now_ms", l_now_ms},
    {"count", l_count},
    {"log", l_log},
    {nullptr, nullptr},
};

}  // namespace

// require(name): a shipped policy's table of hooks, to build on
// (`local pa = require "prefix_affinity"`, then `pa.pick(ctx, instances)`
// in a pick of one's own). Loaded once per state, in a sandbox of its own
// (its locals are its own), within the calling code's budget; only the
// shipped policies, never a file.
int l_require(lua_State* L) {
  Impl& I = impl_of(L);
  std::size_t n = 0;
  const char* name = luaL_checklstring(L, 1, &n);
  if (I.modules_ref == LUA_NOREF) {
    lua_newtable(L);
    I.modules_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.modules_ref);
  const int modules = lua_gettop(L);
  lua_pushlstring(L, name, n);
  lua_rawget(L, modules);
  if (lua_istable(L, -1))
    return 1;
  if (lua_isboolean(L, -1))
    return luaL_error(L, "require: '%s' requires itself", name);
  const char* text = I.svc.module_text != nullptr ? I.svc.module_text({name, n}) : nullptr;
  if (text == nullptr)
    return luaL_error(L, "require: no shipped policy named '%s'", name);
  lua_pushlstring(L, name, n);
  lua_pushboolean(L, 0);
  lua_rawset(L, modules);
  const std::string chunk = "@builtin:" + std::string(name, n);
  if (luaL_loadbufferx(L, text, std::strlen(text), chunk.c_str(), "t") != 0)
    return lua_error(L);
  push_sandbox_env(L);
  lua_setfenv(L, -2);
  const int status = lua_pcall(L, 0, 1, 0);
  if (status != 0 || !lua_istable(L, -1)) {
    // Not cached: a later require tries again (this one may have run out
    // of the caller's budget).
    lua_pushlstring(L, name, n);
    lua_pushnil(L);
    lua_rawset(L, modules);
    if (status != 0)
      return lua_error(L);
    return luaL_error(L, "require: '%s' did not return a table", name);
  }
  lua_pushlstring(L, name, n);
  lua_pushvalue(L, -2);
  lua_rawset(L, modules);
  return 1;
}

const void* recheck_token() {
  static const char token = 0;
  return &token;
}

void register_pdgate_lib(lua_State* L) {
  lua_newtable(L);
  luaL_register(L, nullptr, kPdgateLib);
  lua_pushlightuserdata(L, const_cast<void*>(recheck_token()));
  lua_setfield(L, -2, "RECHECK");
  lua_setglobal(L, "pdgate");
  lua_pushcfunction(L, l_require);
  lua_setglobal(L, "require");
}

}  // namespace pdgate::policy::detail
