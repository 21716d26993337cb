// What the sandbox's library replacements (lua_bounded_lib.cpp) need from
// the VM's sandbox (lua_sandbox.cpp): the running call's deadline and a
// bound on how deeply C functions re-enter Lua.
#pragma once

#include <lua.hpp>

namespace pdgate::policy::budget {

// True once the running budgeted call is past its deadline; marks the call
// as timed out, so every later check (and the count hook) fails too.
// False outside a budgeted call.
bool spent(lua_State* L);

// Raises the budget error; call as `return budget::raise(L);`.
int raise(lua_State* L);

// Raises the budget error if the deadline has passed.
inline void check(lua_State* L) {
  if (spent(L))
    raise(L);
}

// C functions that call back into Lua (pcall, xpcall, sort comparators,
// gsub callbacks) nest on the C stack; enter() raises an error past a
// fixed depth instead of letting a recursive script overflow that stack.
// The depth is restored by the pcall that catches the error, so no
// leave() is needed on the error path.
void enter(lua_State* L);
void leave(lua_State* L);
int depth(lua_State* L);
void set_depth(lua_State* L, int depth);

// Called from the watchdog's signal handler on the worker thread: makes
// the call this thread is running (if any) check its deadline after every
// instruction. Async-signal-safe.
void interrupt_current_call();

}  // namespace pdgate::policy::budget
