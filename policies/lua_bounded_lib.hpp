// The sandbox's replacements for library functions whose one call could
// otherwise run far past a policy's budget: the count hook only runs
// between Lua instructions, never inside a C function. See
// docs/policies.md ("What a policy cannot do") for what differs from stock
// Lua.
#pragma once

#include <lua.hpp>

namespace pdgate::policy {

// Replaces, in the state's global `string`, `table` and base libraries
// (before any sandbox copies them; the string metatable's __index is the
// global `string` table, so `s:find()` is covered too):
//  - string.find/match/gmatch/gsub by the bounded matcher (lua_patterns);
//  - string.rep and table.concat by versions that check the deadline as
//    they build their result;
//  - table.sort by a quicksort that checks the deadline as it compares;
//  - functions whose work grows with their input (string.sub/upper/lower/
//    reverse/format/byte/char, table.insert/remove/maxn, unpack, tonumber)
//    by wrappers that check the deadline first when an argument is large,
//    so a loop of such calls cannot run 1000 of them between two checks of
//    the count hook.
void install_bounded_libs(lua_State* L);

}  // namespace pdgate::policy
