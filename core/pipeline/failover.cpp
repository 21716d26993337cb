#include "core/pipeline/failover.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace pdgate {

void note_failure(WorkerContext& w, const Instance& inst, const std::string& why) {
  inst.failures_total.fetch_add(1, std::memory_order_relaxed);
  if (inst.note_request_failure(w.cfg.eject_after, why)) {
    if (w.metrics)
      w.metrics->ejections.fetch_add(1, std::memory_order_relaxed);
    if (w.registry.on_ejected)
      w.registry.on_ejected(inst);
  }
}

void blame(WorkerContext& w, const Instance& inst, const GatewayError& e) {
  if (e.source != ErrorSource::engine || e.kind == ErrorKind::ejected)
    return;
  note_failure(w, inst, e.detail.empty() ? e.message : e.detail);
}

namespace {

bool tried_already(const std::vector<const Instance*>& tried, const Instance* i) {
  return std::find(tried.begin(), tried.end(), i) != tried.end();
}

}  // namespace

std::vector<InstancePtr> untried(const std::vector<InstancePtr>& list,
                                 const std::vector<const Instance*>& tried) {
  std::vector<InstancePtr> out;
  out.reserve(list.size());
  for (const auto& i : list) {
    if (!tried_already(tried, i.get()))
      out.push_back(i);
  }
  return out;
}

bool has_alternative(const std::vector<InstancePtr>& list,
                     const std::vector<const Instance*>& tried) {
  for (const auto& i : list) {
    if (!tried_already(tried, i.get()) && i->healthy.load(std::memory_order_relaxed))
      return true;
  }
  return false;
}

std::string failure_kind(const GatewayError& e) {
  switch (e.kind) {
    case ErrorKind::connect_failed:
      return "connect";
    case ErrorKind::connect_timed_out:
      return "connect_timeout";
    case ErrorKind::timed_out:
      return "timeout";
    case ErrorKind::connection_closed:
      return "closed";
    case ErrorKind::bad_response:
      return "bad_response";
    case ErrorKind::response_too_large:
      return "too_large";
    case ErrorKind::ejected:
      return "ejected";
    default:
      break;
  }
  if (e.engine_status != 0)
    return "status_" + std::to_string(e.engine_status);
  return to_string(e.kind);
}

void note_attempt_failed(PickRetries& retries, Stage stage, const InstancePtr& inst,
                         const GatewayError& e) {
  const auto s = static_cast<std::size_t>(stage);
  ++retries.failed_attempts[s];
  retries.last[s] = PickFailure{inst, failure_kind(e), e.engine_status};
}

bool Failover::may_retry(Stage stage, const GatewayError& e) {
  if (!e.retriable)
    return false;
  bool ok = false;
  int& free = free_[static_cast<int>(stage)];
  if (!e.reached_engine && free > 0) {
    --free;
    ok = true;
  } else {
    ok = take_budget();
  }
  if (ok)
    ++retries_;
  if (ok && w_.metrics) {
    auto& counter =
        stage == Stage::prefill ? w_.metrics->retries_prefill : w_.metrics->retries_decode;
    counter.fetch_add(1, std::memory_order_relaxed);
  }
  return ok;
}

bool Failover::take_budget() {
  if (taken_)
    return false;
  taken_ = true;
  if (w_.metrics == nullptr)
    return true;
  const auto active = w_.active_requests.load(std::memory_order_relaxed);
  const auto limit = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(w_.cfg.retry_budget * static_cast<double>(active)));
  if (w_.metrics->retries_in_flight.fetch_add(1) + 1 > limit) {
    w_.metrics->retries_in_flight.fetch_sub(1);
    w_.metrics->retries_refused.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  holding_ = true;
  return true;
}

void Failover::release() {
  if (holding_ && w_.metrics)
    w_.metrics->retries_in_flight.fetch_sub(1, std::memory_order_relaxed);
  holding_ = false;
}

}  // namespace pdgate
