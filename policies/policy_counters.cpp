#include "policies/policy_counters.hpp"

#include <algorithm>
#include <cctype>

namespace pdgate::policy {

const char* to_string(CallOutcome o) {
  switch (o) {
    case CallOutcome::picked:
      return "picked";
    case CallOutcome::declined:
      return "declined";
    case CallOutcome::accepted:
      return "accepted";
    case CallOutcome::rejected:
      return "rejected";
    case CallOutcome::error:
      return "error";
    case CallOutcome::budget:
      return "budget";
  }
  return "?";
}

namespace {

bool valid_counter_name(std::string_view n) {
  if (n.empty() || n.size() > PolicyCounters::kMaxCustomNameBytes)
    return false;
  if (std::isdigit(static_cast<unsigned char>(n.front())) != 0)
    return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
  });
}

constexpr const char* kWhere[] = {"encode", "prefill", "decode", "request"};

}  // namespace

std::optional<std::string> PolicyCounters::name_error(std::string_view name) {
  if (valid_counter_name(name))
    return std::nullopt;
  return "counter name must be [A-Za-z_][A-Za-z0-9_]*, at most " +
         std::to_string(kMaxCustomNameBytes) + " bytes";
}

std::optional<std::string> PolicyCounters::count(std::string_view name, std::uint64_t n) {
  if (auto err = name_error(name))
    return err;
  std::lock_guard lock(mu_);
  auto it = custom_.find(name);
  if (it == custom_.end()) {
    if (custom_.size() >= kMaxCustomNames) {
      ++custom_refused_;
      return "too many counter names (at most " + std::to_string(kMaxCustomNames) + " per policy)";
    }
    it = custom_.emplace(std::string(name), 0).first;
  }
  it->second += n;
  return std::nullopt;
}

bool PolicyCounters::may_log(std::chrono::steady_clock::time_point now) {
  std::lock_guard lock(mu_);
  if (log_at_ != std::chrono::steady_clock::time_point{}) {
    const double s = std::chrono::duration<double>(now - log_at_).count();
    log_tokens_ = std::min(kLogBurst, log_tokens_ + s * kLogPerSecond);
  }
  log_at_ = now;
  if (log_tokens_ < 1) {
    ++log_dropped_;
    return false;
  }
  log_tokens_ -= 1;
  return true;
}

std::uint64_t PolicyCounters::log_dropped() const {
  std::lock_guard lock(mu_);
  return log_dropped_;
}

void PolicyCounters::write(PrometheusText& m) const {
  for (int w = 0; w < 4; ++w) {
    const bool hook = w == kRequestHook;
    for (const CallOutcome o : {CallOutcome::picked, CallOutcome::declined, CallOutcome::accepted,
                                CallOutcome::rejected, CallOutcome::error, CallOutcome::budget}) {
      const bool pick_only = o == CallOutcome::picked || o == CallOutcome::declined;
      const bool hook_only = o == CallOutcome::accepted || o == CallOutcome::rejected;
      if ((hook && pick_only) || (!hook && hook_only))
        continue;
      m.sample("pdgate_policy_calls_total",
               {{"policy", name_}, {"stage", kWhere[w]}, {"outcome", to_string(o)}}, calls(w, o));
    }
  }
}

PolicyCounters& PolicyMetrics::for_policy(std::string_view name) {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  if (it != by_name_.end())
    return *it->second;
  const std::string key = by_name_.size() < kMaxPolicies ? std::string(name) : "other";
  auto& slot = by_name_[key];
  if (!slot)
    slot = std::make_unique<PolicyCounters>(key);
  return *slot;
}

void PolicyMetrics::write(PrometheusText& m) const {
  std::lock_guard lock(mu_);
  m.counter("pdgate_policy_calls_total",
            "Policy hook calls by policy, stage (encode, prefill, decode picks; request: "
            "on_request) and outcome.");
  for (const auto& [name, c] : by_name_)
    c->write(m);
  m.counter("pdgate_policy_custom_total", "Counters kept by policies with pdgate.count().");
  for (const auto& [name, c] : by_name_) {
    std::lock_guard inner(c->mu_);
    for (const auto& [counter, n] : c->custom_)
      m.sample("pdgate_policy_custom_total", {{"policy", name}, {"name", counter}}, n);
  }
  m.counter("pdgate_policy_log_dropped_total",
            "pdgate.log() lines dropped by the per-policy rate limit (10/s, bursts of 20), and "
            "pdgate.count() calls refused for a new name over the limit (kind).");
  for (const auto& [name, c] : by_name_) {
    std::lock_guard inner(c->mu_);
    m.sample("pdgate_policy_log_dropped_total", {{"policy", name}, {"kind", "log"}},
             c->log_dropped_);
    m.sample("pdgate_policy_log_dropped_total", {{"policy", name}, {"kind", "counter"}},
             c->custom_refused_);
  }
}

std::string policy_label(std::string_view spec) {
  const auto slash = spec.find_last_of('/');
  if (slash != std::string_view::npos)
    spec.remove_prefix(slash + 1);
  if (spec.size() > 4 && spec.substr(spec.size() - 4) == ".lua")
    spec.remove_suffix(4);
  return std::string(spec);
}

}  // namespace pdgate::policy
