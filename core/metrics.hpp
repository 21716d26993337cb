// Gateway-side counters and latency histograms for GET /metrics
// (Prometheus text format, pdgate_ prefix). Shared by all workers: plain
// atomics, plus one mutex-guarded map for the labelled request counter
// (one short lock per request, never held across I/O).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>

namespace pdgate {

// Cumulative histogram with fixed buckets (seconds).
class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1,     2.5,  5,     10,   30};
  void observe(double seconds);

  struct Snapshot {
    std::array<std::uint64_t, kBounds.size()> cumulative{};  // observations <= each bound
    std::uint64_t count = 0;                                 // all of them (+Inf)
    double sum_seconds = 0;
  };
  Snapshot snapshot() const;

 private:
  std::array<std::atomic<std::uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_us_{0};
};

struct GatewayMetrics {
  // route ("/v1/completions", ...), status, stage that decided the answer
  // ("decode", "prefill", "gateway").
  // Allocates only the first time a (route, status, stage) is seen.
  void count_request(std::string_view route, unsigned status, std::string_view stage);
  std::map<std::tuple<std::string, unsigned, std::string>, std::uint64_t> requests() const;

  Histogram request_seconds;
  Histogram prefill_seconds;
  Histogram decode_ttft_seconds;
  Histogram overhead_seconds;
  std::atomic<std::uint64_t> retries_prefill{0};
  std::atomic<std::uint64_t> retries_decode{0};
  std::atomic<std::uint64_t> retries_refused{0};  // over budget
  std::atomic<std::int64_t> retries_in_flight{0};
  std::atomic<std::uint64_t> ejections{0};

 private:
  mutable std::mutex mu_;
  // std::less<>: looked up by string views, without building the key.
  std::map<std::tuple<std::string, unsigned, std::string>, std::uint64_t, std::less<>> requests_;
};

}  // namespace pdgate
