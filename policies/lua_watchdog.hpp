// Interrupts policy calls that are past their deadline but not executing
// the Lua instructions the count hook would catch in time.
//
// The count hook checks the deadline every 1000 VM instructions. A few
// instructions each do work proportional to a string's length (`big .. ""`
// whose result exists already, `<` on long strings), so 1000 of them can
// take seconds. A watchdog thread scans the calls in progress every
// period; for one past its deadline it sends the worker thread a signal
// whose handler (on that thread, like luajit's own SIGINT handler) makes
// the count hook run after every instruction until the call ends.
//
// Cost on the pick path: a few relaxed atomic operations per call, and a
// wake-up of the watchdog when it was idle. Cost otherwise: while calls
// are being made the thread wakes every period; after a period without a
// call it sleeps until the next one begins (an idle gateway wakes it
// never).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include <sys/types.h>

namespace pdgate::policy {

class PolicyWatchdog {
 public:
  // One LuaVm's call in progress.
  struct Slot {
    std::atomic<std::int64_t> deadline_ns{0};  // steady clock; 0: no call
    std::atomic<pid_t> thread{0};              // the calling thread's kernel id
    std::atomic<std::uint64_t> call{0};        // bumped per call
    std::atomic<bool> used{false};
    PolicyWatchdog* owner = nullptr;  // set by acquire()
    std::uint64_t signaled_call = 0;  // watchdog thread only
    std::int64_t signaled_at_ns = 0;  // watchdog thread only
  };

  // The signal the watchdog sends (a real-time one no library here uses).
  static int signal_number();

  explicit PolicyWatchdog(std::chrono::microseconds period = std::chrono::milliseconds(2));
  ~PolicyWatchdog();
  PolicyWatchdog(const PolicyWatchdog&) = delete;
  PolicyWatchdog& operator=(const PolicyWatchdog&) = delete;

  // A slot for one LuaVm, or nullptr when all kSlots are taken (that VM
  // then relies on the count hook alone).
  Slot* acquire();
  void release(Slot* slot);

  // Called by the worker around each budgeted call. The watchdog may
  // signal a thread just after its call ended; the signal is addressed by
  // kernel thread id (tgkill), so at worst it finds the thread gone
  // (ESRCH) or reaches a thread that is not in a call (or whose id was
  // reused), where the handler does nothing.
  static void begin(Slot& s, std::int64_t deadline_ns);
  static void end(Slot& s);

  // Signals sent, for tests.
  std::uint64_t signals_sent() const { return sent_.load(std::memory_order_relaxed); }

 private:
  void run();
  // Returns whether a call was in progress.
  bool scan();
  // Wakes the thread if it sleeps for want of calls.
  void note_call_begun();

  static constexpr std::size_t kSlots = 1024;
  std::array<Slot, kSlots> slots_;
  std::mutex slots_mu_;  // serializes acquire/release
  // Slots [0, in_use_) may be in use: acquire() takes the first free one,
  // so the scan stays short (a few slots per worker) and out of the
  // worker threads' caches.
  std::atomic<std::size_t> in_use_{0};
  std::chrono::microseconds period_;
  std::atomic<std::uint64_t> sent_{0};
  // Calls begun (bumped only while the thread is idle) and whether it is.
  std::atomic<std::uint32_t> begun_{0};
  std::atomic<bool> idle_{false};
  // Set by the destructor (under mu_, before it bumps begun_): the thread
  // checks it in its timed wait, and after reading begun_, so a bump it
  // read too late cannot be waited on.
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace pdgate::policy
