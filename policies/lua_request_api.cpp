// What the request hook's `req` handle (docs/policies.md) shows a
// script and lets it change: the request's facts and body members, read
// when first asked for, and the methods that fill the RequestDecision
// (headers, max_tokens cap, priority, path). The handle is valid during
// on_request only; the VM's state says which request that is.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "policies/detail/lua_bindings.hpp"
#include "policies/detail/lua_state.hpp"
#include "policies/lua_budget.hpp"

namespace pdgate::policy::detail {
namespace {

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

// Strings read from nested body fields are cut at this many bytes, so a
// policy never copies a whole prompt into its state by accident.
constexpr std::size_t kMaxFieldString = 256 * 1024;
// req.tools lists at most this many names.
constexpr std::size_t kMaxToolNames = 128;

void budget_tick(void* L) {
  budget::check(static_cast<lua_State*>(L));
}

// Cuts `s` to kMaxFieldString bytes at most, at a UTF-8 character's start.
void cut(std::string& s) {
  if (s.size() <= kMaxFieldString)
    return;
  std::size_t n = kMaxFieldString;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80)
    --n;
  s.resize(n);
}

// A JSON string's decoded text, cut; nullopt when `raw` is not a string.
std::optional<std::string> bounded_string(std::string_view raw) {
  if (raw.empty() || raw.front() != '"')
    return std::nullopt;
  auto s = decode_json_string(raw);
  if (s)
    cut(*s);
  return s;
}

// Pushes a JSON value as a policy reads a nested field: a scalar as its
// Lua value (a string cut at kMaxFieldString), an array or object as its
// element count; then its kind ("string", "number", "boolean", "null",
// "array", "object"). Two results.
int push_field(lua_State* L, std::string_view raw) {
  const char c = raw.front();
  if (c == '[' || c == '{') {
    std::size_t count = 0;
    if (c == '[') {
      JsonArrayElements it(raw);
      std::string_view e;
      while (it.next(e)) {
        if (++count % 4096 == 0)
          budget::check(L);
      }
    } else if (auto index = index_json_object(raw)) {
      count = index->members.size();
    }
    lua_pushnumber(L, static_cast<double>(count));
    lua_pushstring(L, c == '[' ? "array" : "object");
    return 2;
  }
  if (c == '"') {
    const auto s = bounded_string(raw);
    if (s)
      lua_pushlstring(L, s->data(), s->size());
    else
      lua_pushnil(L);
    lua_pushliteral(L, "string");
    return 2;
  }
  push_json_scalar(L, raw);
  lua_pushstring(L, raw == "null" ? "null" : (c == 't' || c == 'f') ? "boolean" : "number");
  return 2;
}

// req:body_field(name_or_position, ...): the body's value at that path,
// each step an object member's name or an array element's position
// (1-based, as Lua counts): req:body_field("messages", 1, "content").
// Read when asked, nothing built: see push_field for what it returns;
// nothing when the path names nothing.
int l_req_body_field(lua_State* L) {
  Impl& I = in_hook(L, "body_field");
  const int n = lua_gettop(L) - 1;
  if (n < 1 || n > static_cast<int>(kMaxJsonPathSteps))
    return luaL_error(L, "req:body_field: 1 to %d steps", int(kMaxJsonPathSteps));
  std::array<JsonPathStep, kMaxJsonPathSteps> path;
  for (int k = 0; k < n; ++k) {
    const int arg = k + 2;
    if (lua_type(L, arg) == LUA_TNUMBER) {
      const lua_Number v = lua_tonumber(L, arg);
      if (!(v >= 1 && v <= 1e12) || v != std::floor(v))
        return luaL_argerror(L, arg, "a position (1, 2, ...) or a member name expected");
      path[k].is_index = true;
      path[k].index = static_cast<std::size_t>(v) - 1;
    } else {
      std::size_t len = 0;
      const char* key = luaL_checklstring(L, arg, &len);
      path[k].key = {key, len};
    }
  }
  // The first step is a top-level member: already indexed.
  if (path[0].is_index)
    return 0;
  const auto top = raw_member(I.cur_hook->body, *I.cur_hook->index, path[0].key);
  if (!top)
    return 0;
  const auto raw =
      raw_at_path(*top, path.data() + 1, static_cast<std::size_t>(n - 1), &budget_tick, L);
  if (!raw || raw->empty())
    return 0;
  return push_field(L, *raw);
}

// A message's content as text: a string, or the text parts of a list of
// parts ({"type": "text", "text": ...}) joined by newlines; cut at
// kMaxFieldString bytes.
std::optional<std::string> message_text(lua_State* L, std::string_view message) {
  const JsonPathStep content{"content"};
  const auto raw = raw_at_path(message, &content, 1);
  if (!raw)
    return std::nullopt;
  if (raw->front() == '"')
    return bounded_string(*raw);
  if (raw->front() != '[')
    return std::nullopt;
  std::string out;
  JsonArrayElements parts(*raw);
  std::string_view part;
  std::size_t count = 0;
  while (out.size() < kMaxFieldString && parts.next(part)) {
    if (++count % 4096 == 0)
      budget::check(L);
    const JsonPathStep text{"text"};
    const auto t = raw_at_path(part, &text, 1);
    if (auto s = t ? bounded_string(*t) : std::nullopt) {
      if (!out.empty())
        out += '\n';
      out += *s;
    }
  }
  cut(out);
  return out;
}

// req.system_prompt: the text of a chat's first "system" (or "developer")
// message, nil when there is none.
int system_prompt(lua_State* L, const RequestHookInput& in) {
  const auto raw = raw_member(in.body, *in.index, "messages");
  if (!in.is_chat || !raw)
    return 0;
  JsonArrayElements it(*raw);
  std::string_view m;
  std::size_t count = 0;
  while (it.next(m)) {
    if (++count % 4096 == 0)
      budget::check(L);
    const JsonPathStep role{"role"};
    const auto r = raw_at_path(m, &role, 1);
    if (!r || (*r != "\"system\"" && *r != "\"developer\""))
      continue;
    const auto text = message_text(L, m);
    if (!text)
      return 0;
    lua_pushlstring(L, text->data(), text->size());
    return 1;
  }
  return 0;
}

// req.tools: the names of the request's tools ({"type": "function",
// "function": {"name": ...}}, or a Responses tool's own "name"), in order,
// at most kMaxToolNames; nil when the body has no `tools` list.
int tool_names(lua_State* L, const RequestHookInput& in) {
  const auto raw = raw_member(in.body, *in.index, "tools");
  if (!raw || raw->front() != '[')
    return 0;
  lua_createtable(L, 8, 0);
  JsonArrayElements it(*raw);
  std::string_view tool;
  int n = 0;
  while (n < static_cast<int>(kMaxToolNames) && it.next(tool)) {
    const JsonPathStep function_name[] = {{"function"}, {"name"}};
    auto name = raw_at_path(tool, function_name, 2);
    if (!name)
      name = raw_at_path(tool, function_name + 1, 1);
    if (auto s = name ? bounded_string(*name) : std::nullopt) {
      lua_pushlstring(L, s->data(), s->size());
      lua_rawseti(L, -2, ++n);
    }
  }
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

// req:rate_limit(key, limit, window_s [, message]): the request counts
// as one event under `key`, refused with 429 (and `message`) when `limit`
// events already fell in the last `window_s` seconds. Only declared here:
// the pipeline checks every declared limit after the hook, with --redis
// on Redis for every replica (a hook never waits for I/O).
int l_req_rate_limit(lua_State* L) {
  Impl& I = in_hook(L, "rate_limit");
  std::size_t n = 0;
  const char* key = luaL_checklstring(L, 2, &n);
  if (n == 0 || n > kMaxRateLimitKeyBytes)
    return luaL_argerror(L, 2, "key must be 1..200 bytes");
  std::int64_t limit = 0;
  check_int(L, 3, 1, static_cast<lua_Number>(kMaxRateLimitEvents), limit);
  const lua_Number window_s = luaL_checknumber(L, 4);
  const lua_Number window_ms = std::ceil(window_s * 1000);
  if (!(window_ms >= 1 && window_ms <= static_cast<lua_Number>(kMaxRateLimitWindowMs)))
    return luaL_argerror(L, 4, "window must be 0.001..31536000 seconds");
  std::size_t mn = 0;
  const char* message = luaL_optlstring(L, 5, "", &mn);
  auto& limits = I.cur_decision->rate_limits;
  if (limits.size() >= kMaxRateLimitsPerRequest)
    return luaL_error(L, "req:rate_limit: at most %d limits per request",
                      int(kMaxRateLimitsPerRequest));
  // As a refusal's message is: at most 1024 bytes kept.
  limits.push_back({std::string(key, n), limit, static_cast<std::int64_t>(window_ms),
                    std::string(message, std::min<std::size_t>(mn, 1024))});
  return 0;
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
                                      {"set_path", l_req_set_path},
                                      {"rate_limit", l_req_rate_limit},
                                      {"body_field", l_req_body_field}};
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
  } else if (k == "system_prompt") {
    if (system_prompt(L, in) == 0)
      return 0;
  } else if (k == "tools") {
    if (tool_names(L, in) == 0)
      return 0;
  } else if (k == "headers") {
    lua_createtable(L, 0, 8);
    if (in.for_each_header != nullptr)
      in.for_each_header(in.header_source, L, &add_header);
  } else if (k == "key") {
    if (in.key == nullptr)
      return 0;
    push_client_key(L, in.key);
  } else if (k == "vars") {
    push_vars(I, in.serial);
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

}  // namespace

void create_request_metatables(Impl& I) {
  lua_State* L = I.L;
  // The request hook's handles: fields filled on first read; scripts
  // cannot replace the metatables.
  for (auto [index, ref] : {std::pair<lua_CFunction, int*>{req_index, &I.req_meta_ref},
                            std::pair<lua_CFunction, int*>{body_index, &I.body_meta_ref}}) {
    lua_createtable(L, 0, 2);
    lua_pushcfunction(L, index);
    lua_setfield(L, -2, "__index");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    *ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
}

void push_request_handle(Impl& I) {
  lua_State* L = I.L;
  lua_createtable(L, 0, 4);
  lua_rawgeti(L, LUA_REGISTRYINDEX, I.req_meta_ref);
  lua_setmetatable(L, -2);
}

}  // namespace pdgate::policy::detail
