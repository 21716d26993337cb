// The sandbox every policy call runs in: the pure libraries and the
// per-script environment of safe globals, the memory cap (the state's
// allocator), the time budget (the count hook, and what the watchdog's
// signal switches on), and pcall/xpcall that cannot swallow the budget.
// What scripts can call lives elsewhere (lua_pdgate_lib.cpp,
// lua_request_api.cpp, lua_context.cpp); this file only bounds them.
#include "policies/detail/lua_sandbox.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "policies/lua_bounded_lib.hpp"
#include "policies/lua_budget.hpp"
#include "policies/lua_watchdog.hpp"

namespace pdgate::policy::detail {
namespace {

// Instructions between two deadline checks. A check reads the clock
// (~20 ns); 1000 interpreted instructions take about 1-3 µs, so an
// overrun is caught within a few µs of the deadline.
constexpr int kHookCount = 1000;

// Allocations at least this large check the deadline: they are where work
// that grows with data happens (`s .. s`, string results, table growth),
// and checking only them keeps the clock off the small-allocation path.
constexpr std::size_t kLargeAlloc = 256 * 1024;

// How deeply C functions may re-enter Lua (pcall in pcall, a sort
// comparator that sorts, ...). Each level costs a few hundred bytes to a
// few KiB of the worker thread's C stack.
constexpr int kMaxCDepth = 100;

// CPU time a call that ran few instructions may use past its deadline
// before it is stopped (see count_hook), and how often, in wall time,
// count_hook reads that CPU time (a system call) meanwhile.
constexpr auto kSlowCpuAllowance = std::chrono::milliseconds(2);
constexpr auto kCpuCheckEvery = std::chrono::milliseconds(1);

// This thread's CPU time (excludes time the OS ran other threads).
Clock::duration thread_cpu_time() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

constexpr const char* kBudgetMessage = "policy exceeded its time budget";

// The memory cap: LuaJIT (GC64) accepts a custom allocator, so every byte
// the state holds goes through here and growth past the limit fails with
// a Lua "not enough memory" error instead of taking the process down.
void* limited_alloc(void* ud, void* ptr, std::size_t osize, std::size_t nsize) {
  auto* I = static_cast<Impl*>(ud);
  const std::size_t old = ptr == nullptr ? 0 : osize;
  if (nsize == 0) {
    std::free(ptr);
    I->mem_used -= old;
    return nullptr;
  }
  if (nsize > old && I->mem_used + (nsize - old) > I->mem_limit)
    return nullptr;
  // A large allocation past the deadline fails (the call reports the
  // budget, see budgeted_call): a VM instruction such as `s .. s` copies
  // megabytes without returning to the count hook.
  if (nsize >= old + kLargeAlloc && I->in_call && (I->timed_out || Clock::now() > I->deadline)) {
    I->timed_out = true;
    return nullptr;
  }
  void* p = std::realloc(ptr, nsize);
  if (p == nullptr)
    return nullptr;
  I->mem_used = I->mem_used - old + nsize;
  return p;
}

// The budget: JIT compilation is off for policy states (see create), so
// the interpreter calls this every kHookCount instructions, JIT or not.
void count_hook(lua_State* L, lua_Debug* /*ar*/) {
  Impl& I = impl_of(L);
  if (!I.in_call)
    return;
  if (I.fast_hook == 0) {
    // Below min_ticks the call has not run enough instructions to be
    // blamed for any lateness, so the clock is not even read; a call kept
    // late by slow instructions is the watchdog's job (it switches the
    // call to fast_hook).
    if (++I.ticks < I.min_ticks && !I.timed_out)
      return;
  } else if (++I.fast_steps % kHookCount == 0) {
    ++I.ticks;
  }
  if (!I.timed_out) {
    const auto now = Clock::now();
    if (now <= I.deadline)
      return;
    // Past the deadline counts at once if the script also ran the
    // instructions such a time takes (an infinite loop does, just after
    // the deadline). With fewer, either the OS preempted the worker
    // mid-pick, which is not the policy's fault, or the instructions were
    // slow (each `..` or `<` on a string of megabytes is one); the
    // thread's CPU time tells them apart, read at most every
    // kCpuCheckEvery because it costs a system call.
    if (I.ticks < I.min_ticks) {
      if (I.cpu_mark_at == Clock::time_point{}) {
        I.cpu_mark = thread_cpu_time();
        I.cpu_mark_at = now;
        return;
      }
      if (now - I.cpu_mark_at < kCpuCheckEvery)
        return;
      I.cpu_mark_at = now;
      if (thread_cpu_time() - I.cpu_mark < kSlowCpuAllowance)
        return;
    }
    I.timed_out = true;
  }
  luaL_error(L, kBudgetMessage);
}

// pcall/xpcall for scripts: they cannot swallow the budget error, or
// `while true do pcall(loop) end` would run forever.
int safe_pcall(lua_State* L) {
  luaL_checkany(L, 1);
  const int depth = budget::depth(L);
  budget::enter(L);
  const int status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  budget::set_depth(L, depth);
  if (impl_of(L).timed_out)
    return lua_error(L);
  lua_pushboolean(L, status == 0);
  lua_insert(L, 1);
  return lua_gettop(L);
}

// xpcall(f, handler, ...) never gives the handler to lua_pcall. LuaJIT
// runs a message handler where the error was raised, and an error raised
// by the count hook leaves the hook marked active there, so a handler
// that loops would never be interrupted. Here f runs under a plain
// lua_pcall (which clears that mark), then the handler runs as ordinary,
// hooked code with the error value, unless the error was the budget.
// Without a debug library a handler cannot tell the difference.
int safe_xpcall(lua_State* L) {
  luaL_checktype(L, 2, LUA_TFUNCTION);
  const int depth = budget::depth(L);
  budget::enter(L);
  // f, handler, args... -> handler, f, args...
  lua_pushvalue(L, 2);
  lua_remove(L, 2);
  lua_insert(L, 1);
  const int status = lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 0);
  budget::set_depth(L, depth);
  if (impl_of(L).timed_out)
    return lua_error(L);
  if (status == 0) {
    lua_pushboolean(L, 1);
    lua_replace(L, 1);
    return lua_gettop(L);
  }
  // Stack: handler, error. As in LuaJIT, only runtime errors reach the
  // handler; a memory error is returned as it is.
  if (status == LUA_ERRRUN) {
    lua_pushvalue(L, 1);
    lua_insert(L, -2);
    budget::enter(L);
    const int hstatus = lua_pcall(L, 1, 1, 0);
    budget::set_depth(L, depth);
    if (impl_of(L).timed_out)
      return lua_error(L);
    if (hstatus != 0) {
      lua_pop(L, 1);
      lua_pushliteral(L, "error in error handling");
    }
  }
  lua_pushboolean(L, 0);
  lua_insert(L, -2);
  return 2;
}

// Globals a policy may use. Everything else (os, io, debug, ffi, jit,
// package/require, load*, dofile, getfenv/setfenv, collectgarbage) is
// simply not there.
constexpr const char* kSafeGlobals[] = {
    "assert",   "error",        "ipairs",       "next",     "pairs",   "select",
    "tonumber", "tostring",     "type",         "unpack",   "rawget",  "rawset",
    "rawequal", "setmetatable", "getmetatable", "_VERSION", "require",
};
constexpr const char* kSafeLibs[] = {"string", "table", "math", "bit"};

// The call this thread is running, for the watchdog's signal handler.
thread_local Impl* t_running = nullptr;

}  // namespace

Result<bool> open_sandboxed_state(Impl& I) {
  I.L = lua_newstate(limited_alloc, &I);
  if (I.L == nullptr)
    return fail("cannot create a Lua state (memory limit too small?)");
  lua_State* L = I.L;
  // Hooks are not called from JIT-compiled traces, so an infinite loop
  // that got compiled could never be stopped; policies run interpreted
  // (bench/README.md measures what that costs).
  luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
  // Only pure libraries are opened; io, os, package, debug, ffi and jit
  // never are.
  const luaL_Reg libs[] = {{"", luaopen_base},
                           {LUA_TABLIBNAME, luaopen_table},
                           {LUA_STRLIBNAME, luaopen_string},
                           {LUA_MATHLIBNAME, luaopen_math},
                           {LUA_BITLIBNAME, luaopen_bit}};
  for (const auto& lib : libs) {
    const char* name = lib.name;
    const lua_CFunction open = lib.func;
    lua_pushcfunction(L, open);
    lua_pushstring(L, name);
    if (lua_pcall(L, 1, 0, 0) != 0)
      return fail("cannot open Lua libraries: " + pop_error(L));
  }
  install_bounded_libs(L);
  // string.dump would hand out bytecode, which can break the VM's
  // invariants when loaded; strings' metatable shares this table.
  lua_getglobal(L, LUA_STRLIBNAME);
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  lua_pop(L, 1);
  lua_sethook(L, count_hook, LUA_MASKCOUNT, kHookCount);
  return true;
}

std::string pop_error(lua_State* L) {
  // Only a string is read as it is: lua_tostring would convert a number in
  // place, an allocation outside any protected call.
  std::string out;
  if (lua_type(L, -1) == LUA_TSTRING) {
    std::size_t n = 0;
    const char* msg = lua_tolstring(L, -1, &n);
    out.assign(msg, n);
  } else if (lua_type(L, -1) == LUA_TNUMBER) {
    out = std::to_string(lua_tonumber(L, -1));
  } else {
    out = std::string("(error object is a ") + luaL_typename(L, -1) + ")";
  }
  lua_pop(L, 1);
  return out;
}

// Calls the function below `nargs` arguments on the stack under the
// budget. Returns the status; on error the message is on the stack.
int budgeted_call(Impl& I, int nargs, int nresults, Clock::duration budget) {
  I.deadline = Clock::now() + budget;
  I.ticks = 0;
  // The interpreter runs well over 100 instructions per microsecond; a
  // floor of 50 (in thousands per hook call) is reached by any real loop.
  I.min_ticks =
      std::chrono::duration_cast<std::chrono::microseconds>(budget).count() * 50 / kHookCount;
  I.timed_out = false;
  I.c_depth = 0;
  I.cpu_mark_at = Clock::time_point{};
  I.in_call = true;
  if (I.watchdog_slot != nullptr) {
    PolicyWatchdog::begin(*I.watchdog_slot, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                I.deadline.time_since_epoch())
                                                .count());
  }
  t_running = &I;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const int status = lua_pcall(I.L, nargs, nresults, 0);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_running = nullptr;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  if (I.watchdog_slot != nullptr)
    PolicyWatchdog::end(*I.watchdog_slot);
  if (I.fast_hook != 0) {
    lua_sethook(I.L, count_hook, LUA_MASKCOUNT, kHookCount);
    I.fast_hook = 0;
    I.fast_steps = 0;
  }
  I.in_call = false;
  return status;
}

std::string pop_call_error(Impl& I) {
  std::string msg = pop_error(I.L);
  // A call stopped by the budget may have failed elsewhere first (e.g. a
  // large allocation refused past the deadline says "not enough memory").
  // Composed here, not in Lua: the state may have no memory left.
  if (I.timed_out && msg.find(kBudgetMessage) == std::string::npos)
    msg = std::string(kBudgetMessage) + " (" + msg + ")";
  return msg;
}

// A fresh environment table for one script, holding only safe globals.
void push_sandbox_env(lua_State* L) {
  lua_createtable(L, 0, 24);
  for (const char* name : kSafeGlobals) {
    lua_getglobal(L, name);
    lua_setfield(L, -2, name);
  }
  for (const char* name : kSafeLibs) {
    // A copy per script, so one script cannot change math.max for another.
    lua_getglobal(L, name);
    lua_createtable(L, 0, 32);
    lua_pushnil(L);
    while (lua_next(L, -3) != 0) {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_settable(L, -4);
    }
    lua_remove(L, -2);
    lua_setfield(L, -2, name);
  }
  lua_pushcfunction(L, safe_pcall);
  lua_setfield(L, -2, "pcall");
  lua_pushcfunction(L, safe_xpcall);
  lua_setfield(L, -2, "xpcall");
  lua_getglobal(L, "pdgate");
  lua_setfield(L, -2, "pdgate");
  lua_pushvalue(L, -1);
  lua_setfield(L, -2, "_G");
}

}  // namespace pdgate::policy::detail

// --- What the bounded library functions need (lua_budget.hpp) -----------------

namespace pdgate::policy::budget {

using detail::Clock;
using detail::count_hook;
using detail::Impl;
using detail::impl_of;
using detail::kBudgetMessage;
using detail::kHookCount;
using detail::kMaxCDepth;
using detail::t_running;

bool spent(lua_State* L) {
  Impl& I = impl_of(L);
  if (!I.in_call)
    return false;
  if (!I.timed_out && Clock::now() > I.deadline)
    I.timed_out = true;
  return I.timed_out;
}

int raise(lua_State* L) {
  impl_of(L).timed_out = true;
  return luaL_error(L, kBudgetMessage);
}

void enter(lua_State* L) {
  Impl& I = impl_of(L);
  if (++I.c_depth > kMaxCDepth) {
    --I.c_depth;
    luaL_error(L, "C stack overflow (pcall, xpcall, sort or gsub nested over %d deep)", kMaxCDepth);
  }
}

void leave(lua_State* L) {
  --impl_of(L).c_depth;
}

int depth(lua_State* L) {
  return impl_of(L).c_depth;
}

void set_depth(lua_State* L, int depth) {
  impl_of(L).c_depth = depth;
}

void interrupt_current_call() {
  Impl* I = t_running;
  if (I == nullptr)
    return;
  I->fast_hook = 1;
  // What luajit's own SIGINT handler does: with the count mask unchanged
  // this only stores the new count, which the interpreter reads before
  // the next instruction.
  lua_sethook(I->L, count_hook, LUA_MASKCOUNT, 1);
}

}  // namespace pdgate::policy::budget
