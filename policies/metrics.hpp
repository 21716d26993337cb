// Engine metrics for policies: a pure parser of vLLM's Prometheus text and
// a scraper that polls every instance's /metrics on a timer and stores the
// numbers in the instance's atomics, so a pick reads them without I/O.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string_view>

#include <boost/asio/io_context.hpp>

#include "core/upstream/instance.hpp"

namespace pdgate {
struct EngineTls;
}

namespace pdgate::policy {

struct EngineMetrics {
  // Each is absent when the text had no sample of it.
  std::optional<double> running;  // vllm:num_requests_running
  std::optional<double> waiting;  // vllm:num_requests_waiting
  std::optional<double>
      kv_usage;  // vllm:kv_cache_usage_perc (0..1); older vllm:gpu_cache_usage_perc
};

// Sums each metric over all its series: vLLM V1 exports one series per
// engine core (label engine="0", "1", ...) and the instance's load is
// their sum. For kv usage, the mean over series is taken, since it is a
// fraction. With `engine` (a data-parallel rank routed to as an instance
// of its own), only that core's series (engine="<rank>") count. Malformed
// lines are skipped, never fatal.
EngineMetrics parse_vllm_metrics(std::string_view text,
                                 std::optional<std::uint32_t> engine = std::nullopt);

// Starts polling GET /metrics of every instance in the registry's current
// snapshot each `interval`, with a timeout of `interval` (at least 200 ms)
// per request, at most `max_concurrency` at a time, each instance at its
// own offset into the interval (core/upstream/probe_rounds.hpp). Runs on `ioc`
// (which one thread must run) until it is stopped; returns at once. An
// instance that does not answer keeps its last numbers, and its
// metrics_at_ms tells how old they are. `tls` reaches https:// instances.
void start_metrics_scraper(boost::asio::io_context& ioc, const Registry& registry,
                           std::chrono::milliseconds interval, std::size_t max_concurrency = 64,
                           std::shared_ptr<const EngineTls> tls = nullptr);

// Stores parsed numbers into the instance's atomics.
void store_metrics(const Instance& inst, const EngineMetrics& m, std::int64_t now_ms);

}  // namespace pdgate::policy
