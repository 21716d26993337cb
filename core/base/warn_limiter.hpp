// Rate-limited warnings: a failure that repeats for every request (a store
// down, an engine misconfigured) is logged once per interval, with how
// many were held back, instead of flooding the log.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace pdgate {

// Lets one warning through per interval across all workers; counts what it
// held back so the next warning can say how many were suppressed.
class WarnLimiter {
 public:
  explicit WarnLimiter(std::chrono::milliseconds interval) : interval_ms_(interval.count()) {}
  // Returns true when the caller should log now; `suppressed` then holds how
  // many warnings were held back since the last one let through.
  bool allow(std::int64_t now_ms, std::uint64_t& suppressed) {
    std::int64_t next = next_ms_.load(std::memory_order_relaxed);
    if (now_ms >= next &&
        next_ms_.compare_exchange_strong(next, now_ms + interval_ms_, std::memory_order_relaxed)) {
      suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
      return true;
    }
    suppressed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }

 private:
  const std::int64_t interval_ms_;
  std::atomic<std::int64_t> next_ms_{0};
  std::atomic<std::uint64_t> suppressed_{0};
};

}  // namespace pdgate
