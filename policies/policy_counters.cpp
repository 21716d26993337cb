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
    case CallOutcome::recheck:
      return "recheck";
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

std::string policy_label(std::string_view spec) {
  const auto slash = spec.find_last_of('/');
  if (slash != std::string_view::npos)
    spec.remove_prefix(slash + 1);
  if (spec.size() > 4 && spec.substr(spec.size() - 4) == ".lua")
    spec.remove_suffix(4);
  return std::string(spec);
}

}  // namespace pdgate::policy
