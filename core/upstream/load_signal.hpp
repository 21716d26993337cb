// Tells the thread that shares this replica's load (plugins/redis_load_sync.hpp)
// that the load changed, so that a pick reaches the other replicas within a
// Redis round trip instead of at the next poll.
//
// Why a wake-up and not a faster poll: replicas behind one load balancer
// get bursts of requests within a millisecond of each other, and a pick
// the others have not seen yet is one they pile onto (bench/README.md,
// "Picks that miss each other"). Polling at 5 ms left a pick unseen for
// 2-7 ms; polling at a fraction of a millisecond would wake every replica
// thousands of times a second while nothing changes. (Picks closer
// together than a report's round trip still miss each other.)
//
// notify() is on the request path (a pick, a prefill done, a request
// ended): one atomic exchange, and, only when the listener waits, one
// write to an eventfd (non-blocking; at most one per report the listener
// sends, however many requests change the load meanwhile).
#pragma once

#include <atomic>

namespace pdgate {

class LoadChangeSignal {
 public:
  LoadChangeSignal();
  ~LoadChangeSignal();
  LoadChangeSignal(const LoadChangeSignal&) = delete;
  LoadChangeSignal& operator=(const LoadChangeSignal&) = delete;

  // From any thread. Wakes the listener once until it arms again; nothing
  // while it does not wait (it is sending, or there is none).
  void notify() const noexcept;

  // The listener's side (one thread). arm(): the next notify() wakes it;
  // it then finds fd() readable. take(): reads the wake-up off the fd.
  void arm() const noexcept { armed_.store(true, std::memory_order_release); }
  void take() const noexcept;
  // -1 when the eventfd could not be made: notify() does nothing and the
  // listener polls.
  int fd() const noexcept { return fd_; }

 private:
  int fd_ = -1;
  mutable std::atomic<bool> armed_{false};
};

}  // namespace pdgate
