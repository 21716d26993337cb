// Gateway-side counters and latency histograms for GET /metrics
// (Prometheus text format, pdgate_ prefix). Shared by all workers: plain
// atomics, plus one mutex-guarded map for the labelled request counter
// (one short lock per request, never held across I/O). What is measured
// per engine instance lives on the instance (InstanceLatency), so a series
// disappears with its instance and the label sets stay bounded by the
// instance list.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <tuple>

namespace pdgate {

// Bucket bounds (seconds). An LLM request can wait up to the 600 s
// first-byte timeout; gateway overhead is microseconds; the gap between
// two tokens is tens of milliseconds, and a stream may fall silent up to
// the first-byte timeout too.
inline constexpr std::array<double, 18> kLlmLatencyBounds = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
inline constexpr std::array<double, 21> kTokenGapBounds = {
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1,    0.25,  0.5,    1,    2.5,   5,    10,    30,   600};
inline constexpr std::array<double, 13> kOverheadBounds = {
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
    0.0025,  0.005,    0.01,    0.025,  0.05,    0.1};

// Cumulative histogram over a fixed, ascending set of bounds (seconds).
class Histogram {
 public:
  static constexpr std::size_t kMaxBounds = 24;

  // `bounds` must outlive the histogram (the constants above do) and hold
  // at most kMaxBounds ascending values.
  explicit Histogram(std::span<const double> bounds);

  void observe(double seconds) { observe_n(seconds, 1); }
  // `n` observations of the same value in one step.
  void observe_n(double seconds, std::uint64_t n);

  std::span<const double> bounds() const { return bounds_; }

  struct Snapshot {
    std::array<std::uint64_t, kMaxBounds> cumulative{};  // observations <= each bound
    std::uint64_t count = 0;                             // all of them (+Inf)
    double sum_seconds = 0;
  };
  Snapshot snapshot() const;

 private:
  std::span<const double> bounds_;
  std::array<std::atomic<std::uint64_t>, kMaxBounds + 1> buckets_{};
  // Nanoseconds: overhead observations are a few microseconds each.
  std::atomic<std::uint64_t> sum_ns_{0};
};

// Token counts an engine reported in its answer's `usage`.
struct TokenUsage {
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
};

// What this gateway measured on one engine instance.
struct InstanceLatency {
  // Decode: from sending the request to its first SSE data event (a
  // stream), or to the whole answer (not a stream).
  Histogram ttft_stream{kLlmLatencyBounds};
  Histogram ttft_whole{kLlmLatencyBounds};
  // Decode: between successive data events of a stream.
  Histogram inter_token{kTokenGapBounds};
  // Prefill: successful prefill requests, sent to answered.
  Histogram prefill{kLlmLatencyBounds};
  std::atomic<std::uint64_t> prompt_tokens{0};
  std::atomic<std::uint64_t> completion_tokens{0};

  void add_usage(const TokenUsage& u) {
    prompt_tokens.fetch_add(u.prompt_tokens, std::memory_order_relaxed);
    completion_tokens.fetch_add(u.completion_tokens, std::memory_order_relaxed);
  }
};

struct GatewayMetrics {
  // route ("/v1/completions", ...), status, stage that decided the answer
  // ("decode", "prefill", "gateway").
  // Allocates only the first time a (route, status, stage) is seen.
  void count_request(std::string_view route, unsigned status, std::string_view stage);
  std::map<std::tuple<std::string, unsigned, std::string>, std::uint64_t> requests() const;

  Histogram request_seconds{kLlmLatencyBounds};
  // As the client sees it: from the request's arrival to decode's first
  // data event (streams) or its whole answer.
  Histogram first_token_stream{kLlmLatencyBounds};
  Histogram first_token_whole{kLlmLatencyBounds};
  Histogram overhead_seconds{kOverheadBounds};
  // Sequential legs: from prefill's answer to decode's leg sent; a lease
  // (--kv-lease) that ran out before then re-ran prefill.
  Histogram kv_handoff_seconds{kLlmLatencyBounds};
  std::atomic<std::uint64_t> kv_lease_expired{0};
  std::atomic<std::uint64_t> retries_prefill{0};
  std::atomic<std::uint64_t> retries_decode{0};
  std::atomic<std::uint64_t> retries_refused{0};  // over budget
  // Prefill picks a policy asked to make again (pdgate.RECHECK) and the
  // time they waited for the replicas ahead, in microseconds.
  std::atomic<std::uint64_t> pick_rechecks{0};
  std::atomic<std::uint64_t> pick_recheck_wait_us{0};
  std::atomic<std::int64_t> retries_in_flight{0};
  // Streams whose decode broke off mid-answer, by why (reset, error_event,
  // stall, drain) and what came of it (resumed on another decode, failed:
  // the resumed leg could not be started, refused: not tried).
  static constexpr std::size_t kMigrationReasons = 4;
  static constexpr std::size_t kMigrationOutcomes = 3;
  std::atomic<std::uint64_t> decode_migrations[kMigrationReasons][kMigrationOutcomes] = {};
  std::atomic<std::uint64_t> ejections{0};
  // Routed requests by path: prefill then decode, or one hop to decode
  // (which prefills locally), as the request hook or configuration chose.
  std::atomic<std::uint64_t> path_pd{0};
  std::atomic<std::uint64_t> path_one_hop{0};
  // Client connections whose TLS handshake failed or timed out.
  std::atomic<std::uint64_t> tls_handshake_failures{0};
  // Times a worker's listener paused at --max-connections.
  std::atomic<std::uint64_t> connection_bound_reached{0};

 private:
  mutable std::mutex mu_;
  // std::less<>: looked up by string views, without building the key.
  std::map<std::tuple<std::string, unsigned, std::string>, std::uint64_t, std::less<>> requests_;
};

}  // namespace pdgate
