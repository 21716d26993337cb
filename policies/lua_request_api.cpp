// What the request hook's `req` handle (docs/policies.md) shows a
// script and lets it change: the request's facts and body members, read
// when first asked for, and the methods that fill the RequestDecision
// (headers, max_tokens cap, priority, path). The handle is valid during
// on_request only; the VM's state says which request that is.
#include <algorithm>
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
