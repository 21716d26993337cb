#include "core/pipeline/rate_limit_phase.hpp"

#include <algorithm>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "core/observability/prometheus.hpp"
#include "core/pipeline/request_context.hpp"

namespace pdgate {

namespace {

void bump(std::atomic<std::uint64_t>& c) {
  c.fetch_add(1, std::memory_order_relaxed);
}

class LocalRateLimiter final : public RateLimiter {
 public:
  LocalRateLimiter(const LocalRateCheck& local, RateLimitCounters& counters)
      : local_(local), counters_(counters) {}
  boost::asio::awaitable<RateLimitVerdict> check(std::span<const RateLimitDecl> limits,
                                                 bool count) override {
    co_return check_locally(local_, limits, count, count ? &counters_ : nullptr);
  }

 private:
  const LocalRateCheck& local_;
  RateLimitCounters& counters_;
};

class LocalRateLimits final : public RateLimits {
 public:
  explicit LocalRateLimits(LocalRateCheck local) : local_(std::move(local)) {}
  std::unique_ptr<RateLimiter> make_limiter(boost::asio::any_io_executor) override {
    return std::make_unique<LocalRateLimiter>(local_, counters());
  }

 private:
  LocalRateCheck local_;
};

std::string seconds_text(std::int64_t ms) {
  const std::int64_t s = ms / 1000;
  if (ms % 1000 == 0)
    return std::to_string(s);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", static_cast<double>(ms) / 1000.0);
  return buf;
}

}  // namespace

bool RateLimitVerdict::allowed() const {
  return std::all_of(answers.begin(), answers.end(),
                     [](const RateLimitAnswer& a) { return a.allowed; });
}

RateLimitVerdict check_locally(const LocalRateCheck& local, std::span<const RateLimitDecl> limits,
                               bool count, RateLimitCounters* c) {
  RateLimitVerdict v;
  auto answers = local ? local(limits, count) : Result<std::vector<RateLimitAnswer>>(fail("none"));
  if (!answers || answers->size() != limits.size()) {
    // No store can keep the logs: the request goes on (a limit is the
    // policy's wish, not worth failing requests over), counted.
    if (c != nullptr)
      bump(c->unchecked);
    spdlog::debug("policy rate limits not checked: {}", answers ? "bad answer" : answers.error());
    return v;
  }
  v.answers = std::move(*answers);
  if (c != nullptr)
    bump(v.allowed() ? c->replica_allowed : c->replica_limited);
  return v;
}

void RateLimits::write_metrics(PrometheusText& m) const {
  const auto& c = counters_;
  m.counter("pdgate_policy_rate_limit_checks_total",
            "Requests whose policy-declared limits (req:rate_limit) were checked, by store "
            "(cluster: on Redis for every replica; replica: this replica's own, without --redis "
            "or when Redis did not answer) and outcome (allowed, limited: refused with 429).");
  const std::pair<const char*, std::pair<const char*, const std::atomic<std::uint64_t>*>> rows[] = {
      {"cluster", {"allowed", &c.cluster_allowed}},
      {"cluster", {"limited", &c.cluster_limited}},
      {"replica", {"allowed", &c.replica_allowed}},
      {"replica", {"limited", &c.replica_limited}},
  };
  for (const auto& [store, o] : rows)
    m.sample("pdgate_policy_rate_limit_checks_total", {{"store", store}, {"outcome", o.first}},
             o.second->load(std::memory_order_relaxed));
  m.counter("pdgate_policy_rate_limit_fallbacks_total",
            "Policy-declared limits checked on this replica alone because Redis did not answer "
            "within --redis-timeout (or answered no verdict); unchecked: no store could keep "
            "them, the request was let in.");
  m.sample("pdgate_policy_rate_limit_fallbacks_total", {{"to", "replica"}},
           c.fallbacks.load(std::memory_order_relaxed));
  m.sample("pdgate_policy_rate_limit_fallbacks_total", {{"to", "unchecked"}},
           c.unchecked.load(std::memory_order_relaxed));
}

std::unique_ptr<RateLimits> make_local_rate_limits(LocalRateCheck local) {
  return std::make_unique<LocalRateLimits>(std::move(local));
}

GatewayError rate_limit_refusal(std::span<const RateLimitDecl> limits,
                                const RateLimitVerdict& verdict) {
  std::int64_t wait_ms = 0, longest_window = 1000;
  const RateLimitDecl* first = nullptr;
  for (std::size_t i = 0; i < limits.size() && i < verdict.answers.size(); ++i) {
    if (verdict.answers[i].allowed)
      continue;
    if (first == nullptr)
      first = &limits[i];
    wait_ms = std::max(wait_ms, verdict.answers[i].retry_after_ms);
    longest_window = std::max(longest_window, limits[i].window_ms);
  }
  std::string message;
  if (first != nullptr) {
    message = !first->message.empty()
                  ? first->message
                  : "Rate limit reached: at most " + std::to_string(first->limit) +
                        " requests in " + seconds_text(first->window_ms) + " s";
  }
  GatewayError e = policy_error(429, std::move(message));
  // Whole seconds, rounded up (coming back early only earns another 429);
  // at most the window, whatever a store answered.
  wait_ms = std::clamp<std::int64_t>(wait_ms, 1, longest_window);
  e.headers.emplace_back("Retry-After", std::to_string((wait_ms + 999) / 1000));
  e.reason = "request:limited";
  return e;
}

boost::asio::awaitable<bool> rate_limit_phase(RequestContext& rc) {
  if (rc.rate_limits.empty() || !rc.w.rate_limiter)
    co_return true;
  const RateLimitVerdict v = co_await rc.w.rate_limiter->check(rc.rate_limits, true);
  if (v.allowed())
    co_return true;
  // Refused before it was routed: no path, as for the hook's own refusals.
  if (rc.outcome.record)
    rc.outcome.record->path = "";
  co_return rc.fail(rate_limit_refusal(rc.rate_limits, v));
}

}  // namespace pdgate
