// The sandbox a policy runs in (lua_sandbox.cpp): a state that holds only
// pure libraries and gives each script its own environment of safe
// globals, a memory cap enforced by the state's allocator, and a time
// budget per call enforced by the count hook and the watchdog.
#pragma once

#include <optional>
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
// Allocates nothing in the state.
std::string pop_error(lua_State* L);
// pop_error for a budgeted_call's failure: names the budget when the call
// ran past it.
std::string pop_call_error(Impl& I);

// Runs fill(L) as a protected call (lua_cpcall): what the engine builds in
// the state for a call (the request's tables) may find the state at its
// memory cap, and an allocation failing outside a protected call would
// unwind through the gateway's coroutines. `fill` must leave nothing on the
// stack (what it builds goes to registry slots). Returns the error message
// when it failed; the state is then as fill left it when the error struck.
template <class F>
std::optional<std::string> run_protected(lua_State* L, F&& fill) {
  auto* fn = &fill;
  const auto trampoline = [](lua_State* S) -> int {
    (*static_cast<decltype(fn)>(lua_touserdata(S, 1)))(S);
    return 0;
  };
  if (lua_cpcall(L, trampoline, static_cast<void*>(fn)) == 0)
    return std::nullopt;
  return pop_error(L);
}

}  // namespace pdgate::policy::detail
