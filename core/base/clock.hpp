// Milliseconds of the steady clock: for deadlines, ages and rates, never
// shown as a time of day.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace pdgate {

inline std::int64_t steady_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Milliseconds of the system clock: only for what crosses processes or
// machines (record ages between replicas), whose steady clocks are unrelated.
inline std::int64_t wall_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A random id for this process among the gateway replicas that share
// records through Redis, so each can skip its own.
inline std::uint64_t random_origin() {
  std::random_device rd;
  const std::uint64_t hi = rd(), lo = rd();
  return ((hi << 32) ^ lo ^ static_cast<std::uint64_t>(wall_now_ms())) | 1;
}

}  // namespace pdgate
