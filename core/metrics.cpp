#include "core/metrics.hpp"

namespace pdgate {

void Histogram::observe(double seconds) {
  std::size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i])
    ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_us_.fetch_add(static_cast<std::uint64_t>(seconds * 1e6), std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  std::uint64_t cum = 0;
  for (std::size_t i = 0; i < kBounds.size(); ++i) {
    cum += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = cum;
  }
  s.count = cum + buckets_[kBounds.size()].load(std::memory_order_relaxed);
  s.sum_seconds = static_cast<double>(sum_us_.load(std::memory_order_relaxed)) / 1e6;
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
