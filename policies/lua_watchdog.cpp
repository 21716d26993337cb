// The policy watchdog thread and its signal (lua_watchdog.hpp).
#include "policies/lua_watchdog.hpp"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

#include "policies/lua_budget.hpp"

namespace pdgate::policy {
namespace {

constexpr std::int64_t kResignalNs = 10'000'000;

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The calling thread's kernel id, looked up once per thread.
pid_t this_thread_id() {
  thread_local pid_t id = 0;
  if (id == 0)
    id = static_cast<pid_t>(::syscall(SYS_gettid));
  return id;
}

// Runs on the worker thread the watchdog signalled, wherever it was.
void on_signal(int) {
  budget::interrupt_current_call();
}

// The handler is process-wide by nature; it is installed once, by the
// first watchdog, and does nothing on a thread that is not in a call.
void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(PolicyWatchdog::signal_number(), &sa, nullptr);
  });
}

}  // namespace

int PolicyWatchdog::signal_number() {
  return SIGRTMIN + 5;
}

PolicyWatchdog::PolicyWatchdog(std::chrono::microseconds period) : period_(period) {
  install_handler();
  thread_ = std::thread([this] { run(); });
}

PolicyWatchdog::~PolicyWatchdog() {
  {
    // Under the mutex, so the thread's timed wait cannot miss it; before
    // begun_ is bumped, so its idle wait cannot either (see run()).
    std::lock_guard lock(mu_);
    stopping_.store(true, std::memory_order_seq_cst);
  }
  cv_.notify_all();
  begun_.fetch_add(1, std::memory_order_seq_cst);
  begun_.notify_all();
  thread_.join();
}

void PolicyWatchdog::note_call_begun() {
  if (!idle_.load(std::memory_order_seq_cst))
    return;
  begun_.fetch_add(1, std::memory_order_release);
  begun_.notify_all();
}

PolicyWatchdog::Slot* PolicyWatchdog::acquire() {
  std::lock_guard lock(slots_mu_);
  for (std::size_t i = 0; i < kSlots; ++i) {
    Slot& s = slots_[i];
    if (!s.used.load(std::memory_order_relaxed)) {
      s.deadline_ns.store(0, std::memory_order_relaxed);
      s.owner = this;
      s.used.store(true, std::memory_order_release);
      if (i >= in_use_.load(std::memory_order_relaxed))
        in_use_.store(i + 1, std::memory_order_release);
      return &s;
    }
  }
  return nullptr;
}

void PolicyWatchdog::release(Slot* slot) {
  if (slot == nullptr)
    return;
  std::lock_guard lock(slots_mu_);
  slot->deadline_ns.store(0, std::memory_order_relaxed);
  slot->used.store(false, std::memory_order_release);
}

void PolicyWatchdog::begin(Slot& s, std::int64_t deadline_ns) {
  s.thread.store(this_thread_id(), std::memory_order_relaxed);
  // seq_cst with idle_'s load in note_call_begun: either this call is
  // counted by the watchdog's re-sum after it went idle, or it sees idle_
  // and wakes it.
  s.call.store(s.call.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
  s.deadline_ns.store(deadline_ns, std::memory_order_release);
  if (s.owner != nullptr)
    s.owner->note_call_begun();
}

void PolicyWatchdog::end(Slot& s) {
  s.deadline_ns.store(0, std::memory_order_release);
}

void PolicyWatchdog::run() {
  std::unique_lock lock(mu_);
  std::uint64_t calls_seen = 0;
  while (!stopping_.load(std::memory_order_relaxed)) {
    lock.unlock();
    const bool busy = scan();
    std::uint64_t calls = 0;
    for (std::size_t i = 0, n = in_use_.load(std::memory_order_acquire); i < n; ++i)
      calls += slots_[i].call.load(std::memory_order_relaxed);
    if (!busy && calls == calls_seen) {
      // No call in a whole period: sleep until one begins. A call that
      // began between the sum above and idle_ bumps begun_ only if it
      // sees idle_, so the sum is taken again after announcing it.
      // The destructor sets stopping_ before it bumps begun_: a token read
      // after that bump would be waited on forever, so stopping_ is read
      // after the token.
      const auto token = begun_.load(std::memory_order_seq_cst);
      if (stopping_.load(std::memory_order_seq_cst))
        break;
      idle_.store(true, std::memory_order_seq_cst);
      std::uint64_t again = 0;
      for (std::size_t i = 0, n = in_use_.load(std::memory_order_acquire); i < n; ++i)
        again += slots_[i].call.load(std::memory_order_seq_cst);
      if (again == calls)
        begun_.wait(token, std::memory_order_acquire);
      idle_.store(false, std::memory_order_relaxed);
    }
    calls_seen = calls;
    lock.lock();
    cv_.wait_for(lock, period_, [this] { return stopping_.load(std::memory_order_relaxed); });
  }
}

bool PolicyWatchdog::scan() {
  bool busy = false;
  const std::int64_t now = steady_ns();
  const std::size_t n = in_use_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    Slot& s = slots_[i];
    if (!s.used.load(std::memory_order_acquire))
      continue;
    const std::int64_t deadline = s.deadline_ns.load(std::memory_order_acquire);
    if (deadline == 0)
      continue;
    busy = true;
    if (deadline > now)
      continue;
    // Once per call, but again every kResignal while it still runs: the
    // handler's store of the hook count can lose a race with the
    // interpreter reloading it, which only delays the switch.
    const std::uint64_t call = s.call.load(std::memory_order_relaxed);
    if (call == s.signaled_call && now - s.signaled_at_ns < kResignalNs)
      continue;
    s.signaled_call = call;
    s.signaled_at_ns = now;
    ::syscall(SYS_tgkill, ::getpid(), s.thread.load(std::memory_order_relaxed), signal_number());
    sent_.fetch_add(1, std::memory_order_relaxed);
  }
  return busy;
}

}  // namespace pdgate::policy
