// A policy VM's lifecycle, the entry points the engine calls, and what
// scripts see: the instance tables kept in the state, the request hook's
// `req`, and the `pdgate` module. The sandbox and its time and memory
// limits are lua_sandbox.cpp's; policies/detail/ holds what the two share.
#include "policies/lua_vm.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <spdlog/spdlog.h>

#include "core/pipeline/client_key.hpp"

#include "policies/detail/lua_sandbox.hpp"
#include "policies/detail/lua_state.hpp"
#include "policies/lua_budget.hpp"
#include "policies/prefix_hash.hpp"

namespace pdgate::policy {

using detail::budgeted_call;
using detail::Clock;
using detail::Impl;
using detail::impl_of;
using detail::pop_error;
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

namespace {

// --- The pdgate module ------------------------------------------------------

Impl& in_request(lua_State* L, const char* fn) {
  Impl& I = impl_of(L);
  if (I.cur_ctx == nullptr)
    luaL_error(L, "pdgate.%s: only callable inside pick, on_complete or on_request", fn);
  return I;
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
  const auto rows = I.svc.block_index->cached_tokens(*ids);
  lua_createtable(L, 0, static_cast<int>(keys.size()));
  for (const auto& row : rows) {
    if (!row.exact)
      continue;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == row.key) {
        lua_pushnumber(L, static_cast<double>(row.tokens));
        lua_rawseti(L, -2, static_cast<int>(i + 1));
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

// An instance's load as the shipped policies define it: the gateway's
// live in-flight count plus, when its metrics are fresh, the load others
// put on the engine as of the last scrape (Instance::engine_other_load).
// Mirrors the loop in policies/least_load.lua.
std::int64_t load_of(const Instance& inst, std::int64_t now_ms) {
  std::int64_t l = inst.in_flight.load(std::memory_order_relaxed);
  const std::int64_t at = inst.metrics_at_ms.load(std::memory_order_relaxed);
  if (at != 0 && now_ms - at < 10'000)
    l += inst.engine_other_load.load(std::memory_order_relaxed);
  return l;
}

// pdgate.least_loaded([start]) -> instance, its load, the highest load.
// The scan least_load.lua would do, over the C++ instances instead of the
// Lua tables: 256 instances take under 1 us here, ~5 us interpreted.
// Ties go to the first in scan order, which begins at position `start`.
int l_least_loaded(lua_State* L) {
  Impl& I = impl_of(L);
  if (I.cur_list == nullptr)
    luaL_error(L, "pdgate.least_loaded: only callable inside pick");
  const auto& list = *I.cur_list;
  const std::size_t n = list.size();
  const auto start = static_cast<std::size_t>(std::max<lua_Number>(luaL_optnumber(L, 1, 1), 1));
  std::size_t best = n;
  std::int64_t best_load = 0, max_load = -1;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = (start - 1 + k) % n;
    const Instance& inst = *list[i];
    if (!inst.healthy.load(std::memory_order_relaxed))
      continue;
    const std::int64_t l = load_of(inst, I.cur_now_ms);
    if (best == n || l < best_load) {
      best = i;
      best_load = l;
    }
    max_load = std::max(max_load, l);
  }
  if (best == n)
    return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.caches[static_cast<int>(I.cur_ctx->stage)].array_ref);
  lua_rawgeti(L, -1, static_cast<int>(best + 1));
  lua_remove(L, -2);
  lua_pushnumber(L, static_cast<double>(best_load));
  lua_pushnumber(L, static_cast<double>(max_load));
  return 3;
}

// pdgate.load(instance) -> the instance's load as least_loaded counts it,
// from its Lua table: in_flight, plus other_load when has_metrics.
int l_load(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "in_flight");
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

// Runtime failures return nil, err (OpenResty style); caller mistakes raise.
int push_fail(lua_State* L, const std::string& msg) {
  lua_pushnil(L);
  lua_pushlstring(L, msg.data(), msg.size());
  return 2;
}

int l_kv_get(lua_State* L) {
  Impl& I = impl_of(L);
  std::size_t n = 0;
  const char* k = luaL_checklstring(L, 1, &n);
  const auto v = I.svc.kv->get({k, n}, steady_ms(Clock::now()));
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
      I.svc.kv->erase({k, n});
      lua_pushboolean(L, 1);
      return 1;
    default:
      return luaL_argerror(L, 2, "number, string, boolean or nil expected");
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
  auto r = I.svc.kv->incr({k, n}, delta, steady_ms(Clock::now()));
  if (!r)
    return push_fail(L, r.error());
  lua_pushnumber(L, *r);
  return 1;
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

void push_client_key(lua_State* L, const ClientKey* key);

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
  // A reload's self-check on a synthetic request counts nothing.
  if (impl_of(L).checking) {
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
  if (impl_of(L).checking || !c.may_log(Clock::now())) {
    lua_pushboolean(L, 0);
    return 1;
  }
  // Bounded, and one line: a script's text cannot forge log lines.
  std::string line(msg, std::min<std::size_t>(len, 1024));
  for (char& ch : line) {
    if (static_cast<unsigned char>(ch) < 0x20)
      ch = ' ';
  }
  spdlog::log(lv, "policy {}: {}", c.name(), line);
  lua_pushboolean(L, 1);
  return 1;
}

// --- The request hook's `req` handle --------------------------------------------

Impl& in_hook(lua_State* L, const char* what) {
  Impl& I = impl_of(L);
  if (I.cur_hook == nullptr)
    luaL_error(L, "req.%s: the request handle is only valid during on_request", what);
  return I;
}

// A JSON scalar's raw text as a Lua value (nil for null, arrays, objects).
void push_json_scalar(lua_State* L, std::string_view raw) {
  if (raw.empty() || raw == "null") {
    lua_pushnil(L);
  } else if (raw == "true" || raw == "false") {
    lua_pushboolean(L, raw == "true" ? 1 : 0);
  } else if (raw.front() == '"') {
    const auto s = decode_json_string(raw);
    if (s)
      lua_pushlstring(L, s->data(), s->size());
    else
      lua_pushnil(L);
  } else if (raw.front() == '-' || (raw.front() >= '0' && raw.front() <= '9')) {
    // Validated JSON numbers; strtod needs a terminated copy.
    char buf[64];
    const std::size_t n = std::min(raw.size(), sizeof buf - 1);
    std::memcpy(buf, raw.data(), n);
    buf[n] = '\0';
    lua_pushnumber(L, std::strtod(buf, nullptr));
  } else {
    lua_pushnil(L);
  }
}

// __index of req.body: a top-level member, parsed when first read.
int body_index(lua_State* L) {
  Impl& I = in_hook(L, "body");
  std::size_t n = 0;
  const char* key = lua_type(L, 2) == LUA_TSTRING ? lua_tolstring(L, 2, &n) : nullptr;
  if (key == nullptr)
    return 0;
  const auto raw = raw_member(I.cur_hook->body, *I.cur_hook->index, {key, n});
  push_json_scalar(L, raw.value_or(""));
  lua_pushvalue(L, 2);
  lua_pushvalue(L, -2);
  lua_rawset(L, 1);
  return 1;
}

// Elements of the chat's messages, counted without building them; a
// count this large is checked against the budget as it goes.
int message_count(lua_State* L, const RequestHookInput& in) {
  const auto raw = raw_member(in.body, *in.index, "messages");
  if (!in.is_chat || !raw)
    return 0;
  JsonArrayElements it(*raw);
  std::string_view e;
  std::size_t count = 0;
  while (it.next(e)) {
    if (++count % 4096 == 0)
      budget::check(L);
  }
  lua_pushnumber(L, static_cast<double>(count));
  return 1;
}

int check_int(lua_State* L, int arg, lua_Number lo, lua_Number hi, std::int64_t& out) {
  const lua_Number v = luaL_checknumber(L, arg);
  if (!(v >= lo && v <= hi) || v != std::floor(v))
    return luaL_argerror(L, arg, "a whole number in range expected");
  out = static_cast<std::int64_t>(v);
  return 0;
}

// req:set_header(name, value) / req:remove_header(name).
int header_edit(lua_State* L, bool remove) {
  Impl& I = in_hook(L, remove ? "remove_header" : "set_header");
  std::size_t n = 0;
  const char* name = luaL_checklstring(L, 2, &n);
  std::optional<std::string> value;
  if (!remove) {
    std::size_t vn = 0;
    const char* v = luaL_checklstring(L, 3, &vn);
    value.emplace(v, vn);
  }
  std::string low(name, n);
  for (char& c : low)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (auto err = header_edit_error(low, value ? &*value : nullptr))
    return luaL_argerror(L, 2, err->c_str());
  auto& edits = I.cur_decision->headers;
  std::erase_if(edits, [&](const HeaderEdit& e) { return e.name == low; });
  if (edits.size() >= kMaxHeaderEdits)
    return luaL_error(L, "req:set_header: at most %d header edits", int(kMaxHeaderEdits));
  edits.push_back({std::move(low), std::move(value)});
  return 0;
}
int l_req_set_header(lua_State* L) {
  return header_edit(L, false);
}
int l_req_remove_header(lua_State* L) {
  return header_edit(L, true);
}

// req:cap_max_tokens(n): the engines get at most n (a lower cap wins).
int l_req_cap_max_tokens(lua_State* L) {
  Impl& I = in_hook(L, "cap_max_tokens");
  std::int64_t n = 0;
  check_int(L, 2, 1, 1e12, n);
  auto& cap = I.cur_decision->max_tokens_cap;
  cap = cap ? std::min(*cap, n) : n;
  return 0;
}

// req:set_priority(n): vLLM's scheduling priority (lower runs first with
// --scheduling-policy priority).
int l_req_set_priority(lua_State* L) {
  Impl& I = in_hook(L, "set_priority");
  std::int64_t n = 0;
  check_int(L, 2, -1e12, 1e12, n);
  I.cur_decision->priority = n;
  return 0;
}

// req:set_path("one_hop" | "pd" | "configured").
int l_req_set_path(lua_State* L) {
  Impl& I = in_hook(L, "set_path");
  const char* p = luaL_checkstring(L, 2);
  RoutePath path;
  if (std::strcmp(p, "one_hop") == 0) {
    path = RoutePath::one_hop;
  } else if (std::strcmp(p, "pd") == 0) {
    path = RoutePath::pd;
  } else if (std::strcmp(p, "configured") == 0) {
    path = RoutePath::configured;
  } else {
    return luaL_argerror(L, 2, "\"one_hop\", \"pd\" or \"configured\" expected");
  }
  I.cur_decision->path = path;
  return 0;
}

void add_hook_header(void* L_, std::string_view name, std::string_view value) {
  auto* L = static_cast<lua_State*>(L_);
  lua_pushlstring(L, name.data(), name.size());
  lua_pushlstring(L, value.data(), value.size());
  lua_rawset(L, -3);
}

// __index of req: fields computed when first read (then kept in the
// table for the rest of the call), and the methods.
int req_index(lua_State* L) {
  std::size_t n = 0;
  const char* key_c = lua_type(L, 2) == LUA_TSTRING ? lua_tolstring(L, 2, &n) : nullptr;
  Impl& I = in_hook(L, key_c != nullptr ? key_c : "?");
  const RequestHookInput& in = *I.cur_hook;
  if (key_c == nullptr)
    return 0;
  const std::string_view k(key_c, n);
  static const luaL_Reg kMethods[] = {{"set_header", l_req_set_header},
                                      {"remove_header", l_req_remove_header},
                                      {"cap_max_tokens", l_req_cap_max_tokens},
                                      {"set_priority", l_req_set_priority},
                                      {"set_path", l_req_set_path}};
  for (const auto& m : kMethods) {
    if (k == m.name) {
      lua_pushcfunction(L, m.func);
      return 1;
    }
  }
  if (k == "request_id") {
    lua_pushlstring(L, in.request_id.data(), in.request_id.size());
  } else if (k == "model") {
    lua_pushlstring(L, in.model.data(), in.model.size());
  } else if (k == "stream") {
    lua_pushboolean(L, in.stream ? 1 : 0);
  } else if (k == "is_chat") {
    lua_pushboolean(L, in.is_chat ? 1 : 0);
  } else if (k == "prompt_bytes") {
    lua_pushnumber(L, static_cast<double>(in.prompt_bytes));
  } else if (k == "prompt_tokens") {
    lua_pushnumber(L, static_cast<double>(estimated_prompt_tokens(in.prompt_bytes)));
  } else if (k == "message_count") {
    if (message_count(L, in) == 0)
      return 0;
  } else if (k == "headers") {
    lua_createtable(L, 0, 8);
    if (in.for_each_header != nullptr)
      in.for_each_header(in.header_source, L, &add_hook_header);
  } else if (k == "key") {
    if (in.key == nullptr)
      return 0;
    push_client_key(L, in.key);
  } else if (k == "body") {
    lua_createtable(L, 0, 4);
    lua_rawgeti(L, LUA_REGISTRYINDEX, I.body_meta_ref);
    lua_setmetatable(L, -2);
  } else {
    return 0;
  }
  lua_pushvalue(L, 2);
  lua_pushvalue(L, -2);
  lua_rawset(L, 1);
  return 1;
}

const luaL_Reg kPdgateLib[] = {
    {"prefix_hashes", l_prefix_hashes},
    {"prefix_matches", l_prefix_matches},
    {"cached_tokens", l_cached_tokens},
    {"prefix_held", l_prefix_held},
    {"least_loaded", l_least_loaded},
    {"load", l_load},
    {"conversation", l_conversation},
    {"kv_get", l_kv_get},
    {"kv_set", l_kv_set},
    {"kv_incr", l_kv_incr},
    {"hash", l_hash},
    {"now_ms", l_now_ms},
    {"count", l_count},
    {"log", l_log},
    {nullptr, nullptr},
};

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
    luaL_unref(L, LUA_REGISTRYINDEX, c.array_ref);
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
      c.keys.push_back(instance_key(inst.spec.url));
      c.versions.push_back(inst.meta_version());
      lua_createtable(L, 0, 16);
      set_number(L, "id", static_cast<double>(inst.id));
      set_number(L, "index", static_cast<double>(i + 1));
      set_string(L, "url", inst.spec.url);
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
    const bool healthy = inst.healthy.load(std::memory_order_relaxed);
    const std::int64_t at = inst.metrics_at_ms.load(std::memory_order_relaxed);
    // Numbers older than 10 s describe a past the policy should not trust.
    const bool fresh = at != 0 && now_ms - at < 10'000;
    if (old.valid && in_flight == old.in_flight && healthy == old.healthy && at == old.metrics_at &&
        fresh == old.has_metrics)
      continue;
    Impl::Shadow now{in_flight, at, healthy, fresh, true};
    lua_rawgeti(L, -1, static_cast<int>(i + 1));
    if (!old.valid || in_flight != old.in_flight)
      set_number(L, "in_flight", static_cast<double>(in_flight));
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

// The fields of ctx, each pushed from the request only when a script
// first reads it (then kept in the table for the rest of the call): most
// policies read one or two of them, and pushing all of them (interning a
// fresh request id string every time) was half the cost of a pick.
constexpr const char* kCtxFields[] = {
    "stage",           "model",      "stream",  "is_chat", "prompt_len",
    "conversation_id", "request_id", "prefill", "headers", "key"};

// Pushes field `i` of kCtxFields for `ctx` (nil when it has no value).
void push_ctx_field(lua_State* L, const PickContext& ctx, int i) {
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
    push_ctx_field(L, *ctx, i);
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

}  // namespace

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
  I->mem_limit = services.memory_limit;
  I->watchdog = services.watchdog;
  if (I->watchdog != nullptr)
    I->watchdog_slot = I->watchdog->acquire();
  if (auto opened = detail::open_sandboxed_state(*I); !opened)
    return fail(opened.error());
  lua_State* L = I->L;
  lua_newtable(L);
  luaL_register(L, nullptr, kPdgateLib);
  lua_setglobal(L, "pdgate");

  lua_createtable(L, 0, 12);
  lua_createtable(L, 0, 2);
  lua_pushlightuserdata(L, I.get());
  lua_pushcclosure(L, ctx_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pushboolean(L, 0);  // scripts cannot read or replace it
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
  I->ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_createtable(L, 0, 6);
  I->outcome_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_newtable(L);
  I->empty_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  // The request hook's handles: fields filled on first read; scripts
  // cannot replace the metatables.
  for (auto [index, ref] : {std::pair<lua_CFunction, int*>{req_index, &I->req_meta_ref},
                            std::pair<lua_CFunction, int*>{body_index, &I->body_meta_ref}}) {
    lua_createtable(L, 0, 2);
    lua_pushcfunction(L, index);
    lua_setfield(L, -2, "__index");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    *ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
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
        return fail("policy " + src.origin + ": " + pop_error(L));
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
  // `pdgate.kv_incr(key) or 0`
  auto r = I.svc.kv->incr(key, 1, steady_ms(Clock::now()));
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
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.stages[static_cast<int>(ctx.stage)].pick_ref);
  push_ctx(I, ctx);
  push_instances(I, ctx.stage, candidates, steady_ms(now));
  const int status = budgeted_call(I, 2, 1, I.svc.budget);
  if (status != 0) {
    a.status = I.timed_out ? PickStatus::budget : PickStatus::error;
    a.error = pop_error(L);
    lua_settop(L, base);
    return a;
  }
  const int t = lua_type(L, -1);
  if (t == LUA_TNIL || (t == LUA_TBOOLEAN && lua_toboolean(L, -1) == 0)) {
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
    // An instance table: it must be one of this pick's, not a copy.
    lua_getfield(L, -1, "index");
    const double d = lua_tonumber(L, -1);
    lua_pop(L, 1);
    bool ok = d >= 1 && d <= static_cast<double>(candidates.size()) && d == std::floor(d);
    if (ok) {
      lua_rawgeti(L, LUA_REGISTRYINDEX, I.caches[static_cast<int>(ctx.stage)].array_ref);
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
  } else {
    a.status = PickStatus::invalid;
    a.error = std::string("pick returned a ") + lua_typename(L, t) +
              " (expected an instance, its position, or nil)";
  }
  lua_settop(L, base);
  if (a.status == PickStatus::chosen && I.prefix_used && !I.checking) {
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
  lua_rawgeti(L, LUA_REGISTRYINDEX, st.complete_ref);
  push_ctx(I, ctx);
  // The instance's table from the stage cache when it is still there, so
  // a policy may key state by the table; a fresh one otherwise.
  const auto& c = I.caches[static_cast<int>(ctx.stage)];
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
  const int status = budgeted_call(I, 3, 0, I.svc.budget);
  std::optional<std::string> err;
  if (status != 0)
    err = (I.timed_out ? "budget: " : "") + pop_error(L);
  lua_settop(L, base);
  return err;
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
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.request_ref);
  lua_createtable(L, 0, 4);
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.req_meta_ref);
  lua_setmetatable(L, -2);
  const int status = budgeted_call(I, 1, 2, I.svc.budget);
  if (status != 0) {
    a.status = I.timed_out ? HookStatus::budget : HookStatus::error;
    a.error = pop_error(L);
    lua_settop(L, base);
    return a;
  }
  // Nothing: go on. A status and a message: answer with them.
  const int t = lua_type(L, -2);
  if (t == LUA_TNIL) {
    a.status = HookStatus::accepted;
  } else if (t == LUA_TNUMBER) {
    const double d = lua_tonumber(L, -2);
    std::size_t n = 0;
    const char* msg = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &n) : nullptr;
    if (d >= 400 && d <= 599 && d == std::floor(d) && (msg != nullptr || lua_isnil(L, -1))) {
      a.status = HookStatus::rejected;
      out.reject_status = static_cast<unsigned>(d);
      out.reject_message = msg != nullptr ? std::string(msg, std::min<std::size_t>(n, 1024))
                                          : std::string("request refused by policy");
    } else {
      a.status = HookStatus::invalid;
      a.error = "on_request returned " + std::to_string(d) +
                " (expected a status 400..599 and an optional message string)";
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
    if (a.status != PickStatus::chosen && a.status != PickStatus::declined) {
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
