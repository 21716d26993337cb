// Where this replica stands among the replicas that share load, so that a
// pick which depends on the others' picks can wait for them.
//
// Replicas behind one load balancer receive a burst's requests within a
// millisecond of each other, and a pick reaches the other replicas a Redis
// round trip later (0.7-0.9 ms on average, 10-20 ms at worst on the
// benchmark's machine: bench/README.md, "Ordering the picks of a burst
// across replicas"). Two replicas that pick at once for the same new
// prefix each find no engine holding it and start it on two engines; one
// that leaves a busy cache at the same moment as another leaves it twice.
// A policy that sees such a pick coming returns pdgate.RECHECK: the
// gateway waits until the replicas ahead of this one have picked and
// their picks have arrived, then asks again (ctx.rechecked).
//
// The order is the replicas' random origins (plugins/redis_load_sync.hpp),
// counting only the replicas with load on some engine: one that takes no
// traffic picks nothing to wait for. The replica first in that order never
// waits; the k-th waits k slots. The load-sharing thread sets it whenever
// a report arrives or a replica expires; a pick reads it without locking.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>

namespace pdgate {

class ReplicaOrder {
 public:
  // A recheck never waits more than this many slots, however many
  // replicas come first: past a few, replicas that wait the same time
  // pick together again, but none waits long.
  static constexpr std::size_t kMaxSlots = 8;

  // From the load-sharing thread: how many replicas with load come before
  // this one (0 without load sharing, or when it lost Redis and the
  // others expired).
  void set_ahead(std::size_t n) const noexcept { ahead_.store(n, std::memory_order_relaxed); }
  std::size_t ahead() const noexcept { return ahead_.load(std::memory_order_relaxed); }

  // How long a recheck waits here, `slot` per replica ahead.
  std::chrono::milliseconds recheck_wait(std::chrono::milliseconds slot) const noexcept {
    return slot * static_cast<long>(std::min(ahead(), kMaxSlots));
  }

 private:
  mutable std::atomic<std::size_t> ahead_{0};
};

}  // namespace pdgate
