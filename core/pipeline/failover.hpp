// What a failed engine call costs and allows: the failure counted
// against the engine (and its ejection), the instances not tried yet, and
// the failover budget of one request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/net/errors.hpp"
#include "core/pipeline/worker.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

// Counts a failure against the instance when it is the engine's (never a
// 4xx, never the gateway's own shortage, never twice for an instance that
// was ejected meanwhile); `eject_after` in a row eject it.
void blame(WorkerContext& w, const Instance& inst, const GatewayError& e);
// The same for a failure known to be the engine's (a stream broken off).
void note_failure(WorkerContext& w, const Instance& inst, const std::string& why);

// `list` without the instances already tried for this request.
std::vector<InstancePtr> untried(const std::vector<InstancePtr>& list,
                                 const std::vector<const Instance*>& tried);
// Whether `list` has a healthy instance not tried yet: retrying is
// pointless (and would turn a 502 into a 503) when there is none.
bool has_alternative(const std::vector<InstancePtr>& list,
                     const std::vector<const Instance*>& tried);

// The failure's kind as a policy's retry pick sees it (ctx.failed.kind):
// "connect", "connect_timeout", "timeout", "closed", "bad_response",
// "too_large", "ejected", "status_NNN" for an engine's 5xx, else the
// ErrorKind's name.
std::string failure_kind(const GatewayError& e);
// Records the failed attempt at `stage` on `inst`, so the pick that
// retries it sees ctx.attempt and ctx.failed.
void note_attempt_failed(PickRetries& retries, Stage stage, const InstancePtr& inst,
                         const GatewayError& e);

// How many more times one request may go to another instance. A request
// that never reached an engine may go elsewhere whatever the retry budget,
// up to kNeverSentRetries times per stage: it cost no engine anything (but
// a request must not walk a long list of dead instances either). Any other
// retry takes one unit of the retry budget (retries in flight stay under
// --retry-budget x requests in flight, at least one, so an outage cannot
// multiply the load on what is left), one per request at most.
class Failover {
 public:
  static constexpr int kNeverSentRetries = 3;

  explicit Failover(WorkerContext& w) : w_(w) {}
  Failover(const Failover&) = delete;
  Failover& operator=(const Failover&) = delete;
  ~Failover() { release(); }

  // Whether `e`, which happened in `stage`, may be retried on another
  // instance; counts the retry (or its refusal) in the metrics.
  bool may_retry(Stage stage, const GatewayError& e);
  // The retry that held a unit of the budget is over: the unit goes back
  // (the request still may not take another).
  void release();
  // Retries this request made (for the access log).
  unsigned retries() const { return retries_; }

 private:
  bool take_budget();

  WorkerContext& w_;
  int free_[3] = {kNeverSentRetries, kNeverSentRetries, kNeverSentRetries};
  bool taken_ = false;
  bool holding_ = false;
  unsigned retries_ = 0;
};

}  // namespace pdgate
