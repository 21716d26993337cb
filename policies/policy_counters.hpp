// Per-policy counters for /metrics: each hook call by stage and outcome,
// the custom counters scripts keep with pdgate.count(), and the rate limit
// on pdgate.log(). Keyed by the policy's name, so a reload that switches
// scripts starts the new one's series and keeps the old one's.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "core/observability/prometheus.hpp"

namespace pdgate::policy {

// Where a hook ran: a pick of a stage (indexed by Stage), or the request
// hook.
constexpr int kRequestHook = 3;
// recheck: a pick answered pdgate.RECHECK (it is then asked again).
enum class CallOutcome { picked, declined, accepted, rejected, recheck, error, budget };
constexpr int kCallOutcomes = 7;
const char* to_string(CallOutcome o);

class PolicyCounters {
 public:
  static constexpr std::size_t kMaxCustomNames = 32;
  static constexpr std::size_t kMaxCustomNameBytes = 64;
  // pdgate.log: 10 lines per second per policy, bursts of 20.
  static constexpr double kLogPerSecond = 10;
  static constexpr double kLogBurst = 20;

  explicit PolicyCounters(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }

  void call(int where, CallOutcome o) {
    calls_[static_cast<std::size_t>(where)][static_cast<std::size_t>(o)].fetch_add(
        1, std::memory_order_relaxed);
  }
  std::uint64_t calls(int where, CallOutcome o) const {
    return calls_[static_cast<std::size_t>(where)][static_cast<std::size_t>(o)].load(
        std::memory_order_relaxed);
  }

  // Adds `n` to the custom counter `name`; an error when the name is not
  // [A-Za-z_][A-Za-z0-9_]* of at most kMaxCustomNameBytes, or is new and
  // the policy already has kMaxCustomNames.
  std::optional<std::string> count(std::string_view name, std::uint64_t n);
  // Why `name` cannot name a custom counter, or nothing.
  static std::optional<std::string> name_error(std::string_view name);
  // Whether a pdgate.log line may be written at `now`; a refused one is
  // counted as dropped.
  bool may_log(std::chrono::steady_clock::time_point now);
  std::uint64_t log_dropped() const;

  void write(PrometheusText& m) const;  // samples only; families by PolicyMetrics

 private:
  friend class PolicyMetrics;
  std::string name_;
  std::array<std::array<std::atomic<std::uint64_t>, kCallOutcomes>, 4> calls_{};
  mutable std::mutex mu_;  // guards what follows
  std::map<std::string, std::uint64_t, std::less<>> custom_;
  std::uint64_t custom_refused_ = 0;
  double log_tokens_ = kLogBurst;
  std::chrono::steady_clock::time_point log_at_{};
  std::uint64_t log_dropped_ = 0;
};

// The counters of every policy loaded since start, shared by all workers.
class PolicyMetrics {
 public:
  // Policies named beyond this count share the series of "other".
  static constexpr std::size_t kMaxPolicies = 64;
  // Stable for the life of this object.
  PolicyCounters& for_policy(std::string_view name);
  void write(PrometheusText& m) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<PolicyCounters>, std::less<>> by_name_;
};

// The name a policy's series carry: a shipped policy's name, or a
// script file's name without its directory and ".lua".
std::string policy_label(std::string_view spec);

}  // namespace pdgate::policy
