// The rate-limit phase of the pipeline: the limits the request hook
// declared (req:rate_limit, core/routing/request_hook.hpp) checked and
// counted together, once the hook has run and before anything is routed.
//
// The hook only declares them, since a hook never waits for I/O; this
// phase is a coroutine and may. With --redis one script call judges and
// counts every limit on Redis's clock, so a limit holds for every replica
// together (plugins/redis_rate_limits.hpp); without, or when Redis does not
// answer in --redis-timeout, the replica's own store answers (the
// policies' shared store, as pdgate.rate), so Redis being away never fails
// a request: each replica then enforces the limits on its own share.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "core/base/result.hpp"
#include "core/net/errors.hpp"
#include "core/routing/request_hook.hpp"

namespace pdgate {

class PrometheusText;
struct RequestContext;

// The replica's own answer (the policies' shared store): judged, and with
// `count` counted, under one lock, no I/O. An error when the store cannot
// keep the logs (full).
using LocalRateCheck = std::function<Result<std::vector<RateLimitAnswer>>(
    std::span<const RateLimitDecl> limits, bool count)>;

// How a request's limits were judged.
struct RateLimitVerdict {
  // One per declared limit, in order; empty when no store could answer
  // (the request is let in).
  std::vector<RateLimitAnswer> answers;
  // Judged on Redis for every replica (false: on this replica alone).
  bool cluster = false;
  // Redis is configured but did not answer: why (for the log, explain).
  std::string fallback;
  bool allowed() const;
};

struct RateLimitCounters {
  // Requests whose limits were checked, by where and how.
  std::atomic<std::uint64_t> cluster_allowed{0}, cluster_limited{0};
  std::atomic<std::uint64_t> replica_allowed{0}, replica_limited{0};
  // Checked on this replica because Redis did not answer (or answered
  // what is no verdict).
  std::atomic<std::uint64_t> fallbacks{0};
  // Let in unchecked: the local store failed too (full).
  std::atomic<std::uint64_t> unchecked{0};
};

// One event loop's handle (a worker's, the admin API's); called on that
// loop only.
class RateLimiter {
 public:
  virtual ~RateLimiter() = default;
  // Judges `limits` together and, with `count`, counts one event under
  // each when all of them let it in. Never fails: a store that cannot
  // answer gives way to the next (Redis, this replica, none).
  virtual boost::asio::awaitable<RateLimitVerdict> check(std::span<const RateLimitDecl> limits,
                                                         bool count) = 0;
};

// The process's side: makes each loop's limiter, keeps the counters.
class RateLimits {
 public:
  virtual ~RateLimits() = default;
  virtual std::unique_ptr<RateLimiter> make_limiter(boost::asio::any_io_executor ex) = 0;
  RateLimitCounters& counters() { return counters_; }
  const RateLimitCounters& counters() const { return counters_; }
  // pdgate_policy_rate_limit_checks_total, _fallbacks_total.
  void write_metrics(PrometheusText& m) const;

 private:
  RateLimitCounters counters_;
};

// Limits judged on this replica alone (no --redis).
std::unique_ptr<RateLimits> make_local_rate_limits(LocalRateCheck local);

// The replica's own answer as a verdict (what the Redis limiter falls
// back to); counted in `c`.
RateLimitVerdict check_locally(const LocalRateCheck& local, std::span<const RateLimitDecl> limits,
                               bool count, RateLimitCounters* c);

// The 429 a verdict that refuses answers: the first refusing limit's
// message (or the gateway's), Retry-After the longest wait, reason
// `request:limited` for the access log.
GatewayError rate_limit_refusal(std::span<const RateLimitDecl> limits,
                                const RateLimitVerdict& verdict);

// Checks and counts the request's declared limits (rc.rate_limits): true
// when it goes on, else false with rc.failure the 429.
boost::asio::awaitable<bool> rate_limit_phase(RequestContext& rc);

}  // namespace pdgate
