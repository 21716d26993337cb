// The sim's counters and gauges, rendered as Prometheus text (vLLM's metric
// names and labels) and as the /sim/stats JSON.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/kv_registry.hpp"

namespace pdgate::sim {

struct Counters {
  std::map<std::string, std::uint64_t> requests_by_path;
  std::uint64_t aborted = 0;
  // Indexed by KvResult (valid, reused, unknown, pull_failed); the puller's view.
  std::array<std::uint64_t, 5> kv_params{};
  // The issuer's view: params issued, and pulls served by result.
  std::uint64_t kv_issued = 0;
  std::array<std::uint64_t, 5> kv_pulls_served{};
  std::uint64_t profile_start = 0;
  std::uint64_t profile_stop = 0;
  std::uint64_t encoder_violations = 0;
  std::uint64_t prefix_cache_queries = 0;  // prompt tokens looked up
  std::uint64_t prefix_cache_hits = 0;     // of those, found in the local cache
  std::uint64_t prompt_tokens = 0;
  std::uint64_t generation_tokens = 0;
  std::uint64_t requests_completed = 0;
  std::uint64_t requests_rejected = 0;  // 503 because the waiting queue was full
  std::uint64_t faults_injected = 0;

  void count_kv(KvResult r) { ++kv_params[static_cast<std::size_t>(r)]; }
  std::uint64_t kv(KvResult r) const { return kv_params[static_cast<std::size_t>(r)]; }
};

// One engine core's load (a data-parallel rank's), exported with its
// engine="<rank>" label as vLLM does.
struct CoreGauges {
  std::size_t running = 0;
  std::size_t waiting = 0;
  double kv_cache_usage = 0.0;  // 0..1
};

struct Gauges {
  // Per core; the fields below are their totals (usage: their mean).
  std::vector<CoreGauges> cores;
  std::size_t running = 0;
  std::size_t waiting = 0;
  double kv_cache_usage = 0.0;  // 0..1
  std::size_t open_connections = 0;
  std::uint64_t connections_total = 0;  // accepted since start: shows connection reuse
  std::size_t issued_kv_outstanding = 0;
  std::size_t prefix_cache_blocks = 0;
};

std::string render_prometheus(const Counters& c, const Gauges& g, std::string_view model);

nlohmann::ordered_json stats_json(const Counters& c, const Gauges& g);

}  // namespace pdgate::sim
