// One budget for the memory that client request bodies hold while they
// are being received, shared by every connection of the process (Envoy's
// overload manager does the same for its buffers). A body grows as its
// bytes arrive, and each growth is charged here first: a client that
// declares a large Content-Length and sends nothing costs nothing, and many
// clients sending large bodies at once cannot hold more than the budget
// together. Past it, a new growth is refused and that request answered 503;
// small requests, whose bodies arrive with their header, are not charged.
// A reload may change the budget at any time (set_limit): charges already
// taken stay, new ones are judged against the new limit.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace pdgate {

class BodyBudget {
 public:
  explicit BodyBudget(std::size_t limit) : limit_(limit) {}
  BodyBudget(const BodyBudget&) = delete;
  BodyBudget& operator=(const BodyBudget&) = delete;

  // Takes `n` bytes of the budget, or nothing and false when that would
  // exceed it (the refusal is counted).
  bool try_charge(std::size_t n) {
    const std::size_t limit = limit_.load(std::memory_order_relaxed);
    std::size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (n > limit || used > limit - n) {
        refusals_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
    } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
    return true;
  }
  void release(std::size_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }

  std::size_t limit() const { return limit_.load(std::memory_order_relaxed); }
  void set_limit(std::size_t limit) { limit_.store(limit, std::memory_order_relaxed); }
  std::size_t used() const { return used_.load(std::memory_order_relaxed); }
  std::uint64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> limit_;
  std::atomic<std::size_t> used_{0};
  std::atomic<std::uint64_t> refusals_{0};
};

// What one body being received holds of the budget; given back when the
// body is complete (or abandoned).
class BodyCharge {
 public:
  explicit BodyCharge(BodyBudget& budget) : budget_(budget) {}
  BodyCharge(const BodyCharge&) = delete;
  BodyCharge& operator=(const BodyCharge&) = delete;
  ~BodyCharge() { budget_.release(held_); }

  // Raises the charge to `total` bytes; false (and unchanged) when the
  // budget cannot take the difference.
  bool grow_to(std::size_t total) {
    if (total <= held_)
      return true;
    if (!budget_.try_charge(total - held_))
      return false;
    held_ = total;
    return true;
  }

 private:
  BodyBudget& budget_;
  std::size_t held_ = 0;
};

}  // namespace pdgate
