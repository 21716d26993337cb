// The sandbox a policy runs in (lua_sandbox.cpp): a state that holds only
// pure libraries and gives each script its own environment of safe
// globals, a memory cap enforced by the state's allocator, and a time
// budget per call enforced by the count hook and the watchdog.
#pragma once

#include <string>

#include "core/base/result.hpp"
#include "policies/detail/lua_state.hpp"

namespace pdgate::policy::detail {

// Creates I.L under I.mem_limit with the pure libraries (their unbounded
// functions replaced, lua_bounded_lib.hpp), JIT compilation off and the
// count hook set. On failure I.L may hold a state ~Impl closes.
Result<bool> open_sandboxed_state(Impl& I);

// Calls the function below `nargs` arguments on the stack under the
// budget. Returns the status; on error the message is on the stack.
int budgeted_call(Impl& I, int nargs, int nresults, Clock::duration budget);

// A fresh environment table for one script, holding only safe globals
// (and the global `pdgate` table, registered before any script loads).
void push_sandbox_env(lua_State* L);

// Pops the error value on top of the stack and returns it as a message.
std::string pop_error(lua_State* L);

}  // namespace pdgate::policy::detail
