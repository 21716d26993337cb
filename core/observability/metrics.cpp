#include "core/observability/metrics.hpp"

#include <algorithm>
#include <cassert>

namespace pdgate {

void Histogram::observe_n(double seconds, std::uint64_t n) {
  // The first bound the value does not exceed (Prometheus' `le`).
  const auto i = static_cast<std::size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin());
  buckets_[i].fetch_add(n, std::memory_order_relaxed);
  if (seconds > 0) {
    sum_ns_.fetch_add(static_cast<std::uint64_t>(seconds * 1e9) * n, std::memory_order_relaxed);
  }
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  std::uint64_t cum = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cum += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = cum;
  }
  s.count = cum + buckets_[bounds_.size()].load(std::memory_order_relaxed);
  s.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

void GatewayMetrics::count_request(std::string_view route, unsigned status,
                                   std::string_view stage) {
  const std::tuple<std::string_view, unsigned, std::string_view> key{route, status, stage};
  std::lock_guard lock(mu_);
  auto it = requests_.find(key);
  if (it == requests_.end())
    it = requests_.emplace(std::tuple(std::string(route), status, std::string(stage)), 0).first;
  ++it->second;
}

std::map<std::tuple<std::string, unsigned, std::string>, std::uint64_t> GatewayMetrics::requests()
    const {
  std::lock_guard lock(mu_);
  return {requests_.begin(), requests_.end()};
}

}  // namespace pdgate
