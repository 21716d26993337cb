// One pick at a time per gateway process, each with the load it adds.
//
// A pick reads every candidate's load and its request then adds its own.
// Two workers picking at once each miss the other's request and choose
// as if it were not there: the soonest start, or a cache whose queue looks
// short enough, for both. One gateway with --workers 4 kept 0.177 of the
// Mooncake trace's prompt tokens cached where the same gateway with one
// worker kept 0.187, and picks taken one at a time gave 0.188 back
// (bench/README.md, "Picks that miss each other").
//
// The wait is bounded: a worker waits at most kPatience (the default
// --policy-budget-us, past which a policy is cut off anyway) for the
// picks before it, then picks without the lock, as it did before there
// was one. A pick holds it for microseconds: the policy, and adding the
// request to the instance's counts.
#pragma once

#include <chrono>
#include <mutex>

namespace pdgate {

class PickLock {
 public:
  static constexpr std::chrono::microseconds kPatience{1000};

  // Held from before a pick until its request is counted against the
  // instance chosen (InFlightGuard); not owned when the wait ran out.
  std::unique_lock<std::timed_mutex> hold() const {
    std::unique_lock<std::timed_mutex> l(mu_, std::defer_lock);
    if (!l.try_lock())
      (void)l.try_lock_for(kPatience);
    return l;
  }

 private:
  mutable std::timed_mutex mu_;
};

}  // namespace pdgate
