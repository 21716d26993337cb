// The policy watchdog thread on its own (policies/lua_watchdog.*): it
// starts, idles and stops without losing a wake-up.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "policies/lua_watchdog.hpp"

namespace pdgate::policy {
namespace {

using namespace std::chrono_literals;

// Fails the test and ends the process if `done` is not set within `limit`:
// a destructor stuck joining the watchdog thread cannot be interrupted.
class HangGuard {
 public:
  HangGuard(const char* what, std::chrono::seconds limit)
      : thread_([this, what, limit] {
          const auto until = std::chrono::steady_clock::now() + limit;
          while (!done_.load()) {
            if (std::chrono::steady_clock::now() > until) {
              std::fprintf(stderr, "FAILED: %s still running after %lld s\n", what,
                           static_cast<long long>(limit.count()));
              std::fflush(stderr);
              std::_Exit(3);
            }
            std::this_thread::sleep_for(10ms);
          }
        }) {}
  ~HangGuard() {
    done_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// A watchdog destroyed while its thread is between its stop check and its
// idle wait must still stop: the destructor's wake-up may not be lost.
// Before the fix the thread could read the wake-up counter after the
// destructor bumped it, then wait on it forever (the join hung).
TEST(PolicyWatchdog, DestroyedAtAnyMomentStops) {
  HangGuard guard("creating and destroying watchdogs", 60s);
  for (int i = 0; i < 20000; ++i) {
    PolicyWatchdog w(std::chrono::microseconds(1));
    if (i % 3 == 1)
      std::this_thread::yield();
  }
}

// The same with calls made: the thread wakes for a call after idling and
// still stops when destroyed.
TEST(PolicyWatchdog, WakesForCallsAndStops) {
  HangGuard guard("watchdogs with calls", 60s);
  for (int i = 0; i < 2000; ++i) {
    PolicyWatchdog w(std::chrono::microseconds(50));
    PolicyWatchdog::Slot* slot = w.acquire();
    ASSERT_NE(slot, nullptr);
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    PolicyWatchdog::begin(*slot,
                          std::chrono::duration_cast<std::chrono::nanoseconds>(now + 1s).count());
    PolicyWatchdog::end(*slot);
    w.release(slot);
  }
}

// A call past its deadline is signalled; the handler does nothing on a
// thread outside a Lua call, so the signal is harmless here.
TEST(PolicyWatchdog, SignalsCallPastDeadline) {
  PolicyWatchdog w(std::chrono::microseconds(200));
  PolicyWatchdog::Slot* slot = w.acquire();
  ASSERT_NE(slot, nullptr);
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  PolicyWatchdog::begin(*slot,
                        std::chrono::duration_cast<std::chrono::nanoseconds>(now).count() - 1);
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (w.signals_sent() == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  PolicyWatchdog::end(*slot);
  w.release(slot);
  EXPECT_GE(w.signals_sent(), 1u);
}

}  // namespace
}  // namespace pdgate::policy
