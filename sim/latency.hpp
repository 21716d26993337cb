// How long the simulated GPU takes. Kept apart from the server so the model
// is unit-tested and documented in one place (docs/sim.md).
#pragma once

#include <chrono>
#include <cstddef>

namespace pdgate::sim {

struct LatencyModel {
  double prefill_base_ms = 2.0;
  double prefill_us_per_token = 50.0;
  double itl_ms = 10.0;
  double kv_pull_ms = 1.0;

  // Computing a prompt: a fixed launch cost plus linear in uncached tokens.
  std::chrono::microseconds prefill(std::size_t uncached_tokens) const {
    return std::chrono::microseconds(static_cast<long long>(
        prefill_base_ms * 1000.0 + static_cast<double>(uncached_tokens) * prefill_us_per_token));
  }
  // One decode step (one output token).
  std::chrono::microseconds itl() const {
    return std::chrono::microseconds(static_cast<long long>(itl_ms * 1000.0));
  }
  // A decode that received the prompt's KV from a prefill: the transfer only.
  std::chrono::microseconds pull() const {
    return std::chrono::microseconds(static_cast<long long>(kv_pull_ms * 1000.0));
  }
};

}  // namespace pdgate::sim
