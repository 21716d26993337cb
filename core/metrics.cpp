#include "core/metrics.hpp"

#include <cstdio>

namespace pdgate {

void Histogram::observe(double seconds) {
  std::size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i])
    ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_us_.fetch_add(static_cast<std::uint64_t>(seconds * 1e6), std::memory_order_relaxed);
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  std::uint64_t cum = 0;
  char buf[64];
  for (std::size_t i = 0; i < kBounds.size(); ++i) {
    cum += buckets_[i].load(std::memory_order_relaxed);
    std::snprintf(buf, sizeof buf, "%g", kBounds[i]);
    out += name + "_bucket{le=\"" + buf + "\"} " + std::to_string(cum) + "\n";
  }
  cum += buckets_[kBounds.size()].load(std::memory_order_relaxed);
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  std::snprintf(buf, sizeof buf, "%.6f", static_cast<double>(sum_us_.load()) / 1e6);
  out += name + "_sum " + buf + "\n";
  // _count equals the +Inf bucket as read above, so a scrape is coherent.
  out += name + "_count " + std::to_string(cum) + "\n";
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

std::string prometheus_escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace pdgate
