// Library functions for policy scripts that stop at the call's deadline
// (lua_bounded_lib.hpp says which and why). Their behaviour is LuaJIT's
// (Lua 5.1 semantics) except where docs/policies.md says otherwise.
#include "policies/lua_bounded_lib.hpp"

#include <algorithm>
#include <cstring>
#include <initializer_list>

#include "policies/lua_budget.hpp"
#include "policies/lua_patterns.hpp"

namespace pdgate::policy {
namespace {

using pattern::Matcher;

// Strings, tables and ranges at least this long make a function check the
// deadline before (and, for long work, while) it runs; shorter inputs cost
// too little to matter and skip the clock read.
constexpr std::size_t kLargeInput = 4096;
// Bytes or elements processed between two deadline checks inside one call.
constexpr std::size_t kCheckEvery = 64 * 1024;
// Bytes string.rep copies between two deadline checks (~0.1 ms).
constexpr std::size_t kRepChunk = 1024 * 1024;
// Comparisons between two deadline checks in table.sort.
constexpr unsigned kSortCheckEvery = 256;

bool keep_going(void* L) {
  return !budget::spent(static_cast<lua_State*>(L));
}

// Raises the error that stopped `m`: the budget, or a malformed pattern.
int match_failed(lua_State* L, const Matcher& m) {
  if (m.stopped())
    return budget::raise(L);
  return luaL_error(L, "%s", m.error());
}

void push_onecapture(lua_State* L, const Matcher& m, int i, const char* s, const char* e) {
  if (i >= m.level()) {
    if (i != 0)
      luaL_error(L, "invalid capture index");
    lua_pushlstring(L, s, static_cast<std::size_t>(e - s));  // the whole match
    return;
  }
  const pattern::Capture& c = m.capture(i);
  if (c.len == pattern::kCapUnfinished)
    luaL_error(L, "unfinished capture");
  if (c.len == pattern::kCapPosition) {
    lua_pushinteger(L, static_cast<lua_Integer>(c.init - m.subject() + 1));
  } else {
    lua_pushlstring(L, c.init, static_cast<std::size_t>(c.len));
  }
}

// Pushes the captures (or the whole match when there are none and `s` is
// given); returns how many.
int push_captures(lua_State* L, const Matcher& m, const char* s, const char* e) {
  const int n = (m.level() == 0 && s != nullptr) ? 1 : m.level();
  luaL_checkstack(L, n, "too many captures");
  for (int i = 0; i < n; ++i)
    push_onecapture(L, m, i, s, e);
  return n;
}

// A plain substring search that checks the deadline as it goes (stock
// LuaJIT's is O(subject x needle) in one call).
const char* plain_find(lua_State* L, const char* s, std::size_t ls, const char* p, std::size_t lp) {
  if (lp == 0)
    return s;
  if (lp > ls)
    return nullptr;
  const char* const last = s + (ls - lp);  // the last possible start
  std::size_t work = 0;
  while (s <= last) {
    const auto* hit = static_cast<const char*>(
        std::memchr(s, static_cast<unsigned char>(p[0]), static_cast<std::size_t>(last - s) + 1));
    if (hit == nullptr)
      return nullptr;
    if (std::memcmp(hit + 1, p + 1, lp - 1) == 0)
      return hit;
    work += static_cast<std::size_t>(hit - s) / 16 + lp;
    if (work >= kCheckEvery) {
      work = 0;
      budget::check(L);
    }
    s = hit + 1;
  }
  return nullptr;
}

// string.find (find = true) and string.match.
int find_aux(lua_State* L, bool find) {
  std::size_t ls = 0, lp = 0;
  const char* s = luaL_checklstring(L, 1, &ls);
  const char* p = luaL_checklstring(L, 2, &lp);
  lua_Integer init = luaL_optinteger(L, 3, 1);
  if (init < 0)
    init += static_cast<lua_Integer>(ls);
  else
    --init;
  if (init < 0)
    init = 0;
  else if (static_cast<std::size_t>(init) > ls)
    init = static_cast<lua_Integer>(ls);
  if (ls >= kLargeInput)
    budget::check(L);
  if (find && (lua_toboolean(L, 4) || !pattern::has_specials(p))) {
    const char* hit = plain_find(L, s + init, ls - static_cast<std::size_t>(init), p, lp);
    if (hit == nullptr) {
      lua_pushnil(L);
      return 1;
    }
    lua_pushinteger(L, static_cast<lua_Integer>(hit - s + 1));
    lua_pushinteger(L, static_cast<lua_Integer>(hit - s) + static_cast<lua_Integer>(lp));
    return 2;
  }
  Matcher m(s, ls, keep_going, L);
  const bool anchor = *p == '^';
  if (anchor)
    ++p;
  const char* s1 = s + init;
  do {
    m.reset();
    const char* e = m.match(s1, p);
    if (e != nullptr) {
      if (find) {
        lua_pushinteger(L, static_cast<lua_Integer>(s1 - s + 1));
        lua_pushinteger(L, static_cast<lua_Integer>(e - s));
        return push_captures(L, m, nullptr, nullptr) + 2;
      }
      return push_captures(L, m, s1, e);
    }
    if (m.failed())
      return match_failed(L, m);
  } while (s1++ < m.subject_end() && !anchor);
  lua_pushnil(L);
  return 1;
}

int str_find(lua_State* L) {
  return find_aux(L, true);
}

int str_match(lua_State* L) {
  return find_aux(L, false);
}

// The iterator gmatch returns; upvalues: subject, pattern, next position.
int gmatch_next(lua_State* L) {
  std::size_t ls = 0;
  const char* s = lua_tolstring(L, lua_upvalueindex(1), &ls);
  const char* p = lua_tostring(L, lua_upvalueindex(2));
  if (ls >= kLargeInput)
    budget::check(L);
  Matcher m(s, ls, keep_going, L);
  for (const char* src = s + lua_tointeger(L, lua_upvalueindex(3)); src <= m.subject_end(); ++src) {
    m.reset();
    const char* e = m.match(src, p);
    if (e != nullptr) {
      lua_Integer next = e - s;
      if (e == src)
        ++next;  // an empty match: move on at least one character
      lua_pushinteger(L, next);
      lua_replace(L, lua_upvalueindex(3));
      return push_captures(L, m, src, e);
    }
    if (m.failed())
      return match_failed(L, m);
  }
  return 0;
}

int str_gmatch(lua_State* L) {
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  lua_settop(L, 2);
  lua_pushinteger(L, 0);
  lua_pushcclosure(L, gmatch_next, 3);
  return 1;
}

// Appends the replacement string (argument 3) for the match [s, e).
void add_string(lua_State* L, Matcher& m, luaL_Buffer* b, const char* s, const char* e) {
  std::size_t l = 0;
  const char* news = lua_tolstring(L, 3, &l);
  if (!m.charge(1 + l / 16))
    match_failed(L, m);
  for (std::size_t i = 0; i < l; ++i) {
    if (news[i] != '%') {
      luaL_addchar(b, news[i]);
      continue;
    }
    ++i;  // news[l] is the string's terminating NUL, as in stock Lua
    const auto c = static_cast<unsigned char>(news[i]);
    if (static_cast<unsigned>(c - '0') >= 10) {
      luaL_addchar(b, news[i]);
    } else if (c == '0') {
      luaL_addlstring(b, s, static_cast<std::size_t>(e - s));
    } else {
      push_onecapture(L, m, c - '1', s, e);
      luaL_addvalue(b);
    }
  }
}

// Appends the replacement for the match [s, e): a string pattern, a table
// lookup or a function call (false/nil keeps the original text).
void add_value(lua_State* L, Matcher& m, luaL_Buffer* b, const char* s, const char* e) {
  switch (lua_type(L, 3)) {
    case LUA_TNUMBER:
    case LUA_TSTRING:
      add_string(L, m, b, s, e);
      return;
    case LUA_TFUNCTION: {
      lua_pushvalue(L, 3);
      const int n = push_captures(L, m, s, e);
      budget::enter(L);
      lua_call(L, n, 1);
      budget::leave(L);
      break;
    }
    case LUA_TTABLE:
      push_onecapture(L, m, 0, s, e);
      lua_gettable(L, 3);
      break;
    default:
      break;
  }
  if (!lua_toboolean(L, -1)) {
    lua_pop(L, 1);
    lua_pushlstring(L, s, static_cast<std::size_t>(e - s));
  } else if (!lua_isstring(L, -1)) {
    luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
  }
  luaL_addvalue(b);
}

int str_gsub(lua_State* L) {
  std::size_t ls = 0;
  const char* src = luaL_checklstring(L, 1, &ls);
  const char* p = luaL_checkstring(L, 2);
  const int tr = lua_type(L, 3);
  const lua_Integer max_s = luaL_optinteger(L, 4, static_cast<lua_Integer>(ls) + 1);
  luaL_argcheck(L,
                tr == LUA_TNUMBER || tr == LUA_TSTRING || tr == LUA_TFUNCTION || tr == LUA_TTABLE,
                3, "string/function/table expected");
  if (ls >= kLargeInput)
    budget::check(L);
  const bool anchor = *p == '^';
  if (anchor)
    ++p;
  Matcher m(src, ls, keep_going, L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_Integer n = 0;
  while (n < max_s) {
    m.reset();
    const char* e = m.match(src, p);
    if (m.failed())
      return match_failed(L, m);
    if (e != nullptr) {
      ++n;
      add_value(L, m, &b, src, e);
    }
    if (e != nullptr && e > src)
      src = e;
    else if (src < m.subject_end())
      luaL_addchar(&b, *src++);
    else
      break;
    if (anchor)
      break;
  }
  luaL_addlstring(&b, src, static_cast<std::size_t>(m.subject_end() - src));
  luaL_pushresult(&b);
  lua_pushinteger(L, n);
  return 2;
}

// string.rep(s, n [, sep]): built in a scratch block (a userdata, so the
// collector reclaims it if the deadline interrupts the copy) by doubling
// the part already written, checking the deadline after every kRepChunk
// bytes copied; the memory cap bounds the size.
int str_rep(lua_State* L) {
  std::size_t l = 0, lsep = 0;
  const char* s = luaL_checklstring(L, 1, &l);
  const lua_Number count = luaL_checknumber(L, 2);
  const char* sep = luaL_optlstring(L, 3, "", &lsep);
  if (count < 1 || (l == 0 && lsep == 0)) {
    lua_pushliteral(L, "");
    return 1;
  }
  // LuaJIT's own limit on a string's length (LJ_MAX_STR).
  const double total_d = count * static_cast<double>(l) + (count - 1) * static_cast<double>(lsep);
  if (total_d >= 2147483648.0)
    return luaL_error(L, "not enough memory");
  const auto n = static_cast<std::size_t>(count);
  const std::size_t unit = l + lsep;  // s and a separator; the last separator is dropped
  const std::size_t want = n * unit;
  if (want >= kLargeInput)
    budget::check(L);
  auto* out = static_cast<char*>(lua_newuserdata(L, want));
  std::memcpy(out, s, l);
  std::memcpy(out + l, sep, lsep);
  // `filled` stays a multiple of `unit`, so copying from the start keeps
  // the pattern.
  std::size_t filled = unit;
  while (filled < want) {
    std::size_t c = std::min(filled, want - filled);
    if (c > kRepChunk)
      c = std::max(unit, kRepChunk / unit * unit);
    std::memcpy(out + filled, out, c);
    filled += c;
    if (filled < want)
      budget::check(L);
  }
  lua_pushlstring(L, out, want - lsep);
  lua_remove(L, -2);
  return 1;
}

// table.concat(t [, sep [, i [, j]]]), checking the deadline every
// kCheckEvery bytes appended.
int tab_concat(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  std::size_t lsep = 0;
  const char* sep = luaL_optlstring(L, 2, "", &lsep);
  lua_Integer i = luaL_optinteger(L, 3, 1);
  const lua_Integer last =
      lua_isnoneornil(L, 4) ? static_cast<lua_Integer>(lua_objlen(L, 1)) : luaL_checkinteger(L, 4);
  if (last - i >= static_cast<lua_Integer>(kLargeInput))
    budget::check(L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  std::size_t since_check = 0;
  for (; i <= last; ++i) {
    lua_rawgeti(L, 1, static_cast<int>(i));
    if (!lua_isstring(L, -1)) {
      return luaL_error(L, "invalid value (%s) at index %d in table for 'concat'",
                        luaL_typename(L, -1), static_cast<int>(i));
    }
    std::size_t len = 0;
    lua_tolstring(L, -1, &len);
    since_check += len + lsep + 8;
    luaL_addvalue(&b);
    if (i != last)
      luaL_addlstring(&b, sep, lsep);
    if (since_check >= kCheckEvery) {
      since_check = 0;
      budget::check(L);
    }
  }
  luaL_pushresult(&b);
  return 1;
}

// --- table.sort ---------------------------------------------------------------
// Lua 5.1's quicksort (median of three, recursion on the smaller part), on
// the table's array through lua_rawgeti/lua_rawseti, counting comparisons
// so that the deadline is checked every kSortCheckEvery of them.

struct Sorter {
  lua_State* L;
  bool has_comparator;
  unsigned compares = 0;

  // Whether the value at stack index a sorts before the one at b.
  bool less(int a, int b) {
    if (++compares >= kSortCheckEvery) {
      compares = 0;
      budget::check(L);
    }
    if (!has_comparator)
      return lua_lessthan(L, a, b) != 0;
    lua_pushvalue(L, 2);
    lua_pushvalue(L, a - 1);  // a and b move down by one with each push
    lua_pushvalue(L, b - 2);
    lua_call(L, 2, 1);
    const bool r = lua_toboolean(L, -1) != 0;
    lua_pop(L, 1);
    return r;
  }

  // t[i] = top, t[j] = the value below it; pops both.
  void set2(int i, int j) {
    lua_rawseti(L, 1, i);
    lua_rawseti(L, 1, j);
  }

  void sort(int lo, int up) {
    while (lo < up) {
      // Order t[lo], t[mid], t[up]; the median becomes the pivot.
      lua_rawgeti(L, 1, lo);
      lua_rawgeti(L, 1, up);
      if (less(-1, -2))
        set2(lo, up);
      else
        lua_pop(L, 2);
      if (up - lo == 1)
        return;
      int i = lo + (up - lo) / 2;
      lua_rawgeti(L, 1, i);
      lua_rawgeti(L, 1, lo);
      if (less(-2, -1)) {
        set2(i, lo);
      } else {
        lua_pop(L, 1);
        lua_rawgeti(L, 1, up);
        if (less(-1, -2))
          set2(i, up);
        else
          lua_pop(L, 2);
      }
      if (up - lo == 2)
        return;
      lua_rawgeti(L, 1, i);  // the pivot P
      lua_pushvalue(L, -1);
      lua_rawgeti(L, 1, up - 1);
      set2(i, up - 1);
      // Invariant: t[lo..i] <= P <= t[j..up]; P stays on the stack.
      i = lo;
      int j = up - 1;
      for (;;) {
        while (lua_rawgeti(L, 1, ++i), less(-1, -2)) {
          if (i > up)
            luaL_error(L, "invalid order function for sorting");
          lua_pop(L, 1);
        }
        while (lua_rawgeti(L, 1, --j), less(-3, -1)) {
          if (j < lo)
            luaL_error(L, "invalid order function for sorting");
          lua_pop(L, 1);
        }
        if (j < i) {
          lua_pop(L, 3);  // the pivot, t[i], t[j]
          break;
        }
        set2(i, j);
      }
      lua_rawgeti(L, 1, up - 1);
      lua_rawgeti(L, 1, i);
      set2(up - 1, i);
      // Recurse into the smaller part, loop on the larger one, so the C
      // stack grows at most logarithmically.
      if (i - lo < up - i) {
        sort(lo, i - 1);
        lo = i + 1;
      } else {
        sort(i + 1, up);
        up = i - 1;
      }
    }
  }
};

int tab_sort(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  const int n = static_cast<int>(lua_objlen(L, 1));
  const bool cmp = !lua_isnoneornil(L, 2);
  if (cmp)
    luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  luaL_checkstack(L, 40, "table.sort");
  if (static_cast<std::size_t>(n) >= kLargeInput)
    budget::check(L);
  Sorter s{L, cmp};
  // Comparators and __lt metamethods run Lua from inside this C call.
  budget::enter(L);
  s.sort(1, n);
  budget::leave(L);
  return 0;
}

// --- Wrappers that check the deadline before large work -----------------------

// Calls the wrapped function (upvalue 1) with the same arguments, after a
// deadline check if any argument is a long string or a long table.
int checked_call(lua_State* L) {
  const int n = lua_gettop(L);
  for (int i = 1; i <= n; ++i) {
    const int t = lua_type(L, i);
    if ((t == LUA_TSTRING || t == LUA_TTABLE) && lua_objlen(L, i) >= kLargeInput) {
      budget::check(L);
      break;
    }
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L);
}

// Replaces field `name` of the table on top of the stack by `f`, or by a
// checked_call wrapper of its current value when `f` is null.
void replace(lua_State* L, const char* name, lua_CFunction f) {
  if (f != nullptr) {
    lua_pushcfunction(L, f);
  } else {
    lua_getfield(L, -1, name);
    if (lua_isnil(L, -1)) {
      lua_pop(L, 1);
      return;
    }
    lua_pushcclosure(L, checked_call, 1);
  }
  lua_setfield(L, -2, name);
}

}  // namespace

void install_bounded_libs(lua_State* L) {
  lua_getglobal(L, LUA_STRLIBNAME);
  replace(L, "find", str_find);
  replace(L, "match", str_match);
  replace(L, "gmatch", str_gmatch);
  replace(L, "gsub", str_gsub);
  replace(L, "rep", str_rep);
  for (const char* name : {"sub", "upper", "lower", "reverse", "format", "byte", "char"})
    replace(L, name, nullptr);
  lua_pop(L, 1);

  lua_getglobal(L, LUA_TABLIBNAME);
  replace(L, "sort", tab_sort);
  replace(L, "concat", tab_concat);
  for (const char* name : {"insert", "remove", "maxn"})
    replace(L, name, nullptr);
  lua_pop(L, 1);

  lua_pushvalue(L, LUA_GLOBALSINDEX);
  for (const char* name : {"unpack", "tonumber"})
    replace(L, name, nullptr);
  lua_pop(L, 1);
}

}  // namespace pdgate::policy
