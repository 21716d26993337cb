// Milliseconds of the steady clock: for deadlines, ages and rates, never
// shown as a time of day.
#pragma once

#include <chrono>
#include <cstdint>

namespace pdgate {

inline std::int64_t steady_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace pdgate
