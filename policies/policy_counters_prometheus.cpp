// PolicyMetrics as Prometheus text (/metrics), apart from the counting so
// that what runs inside the Lua sandbox (and its fuzzer) needs no
// exporter.
#include "policies/policy_counters.hpp"

namespace pdgate::policy {

namespace {

constexpr const char* kWhere[] = {"encode", "prefill", "decode", "request"};

}  // namespace

void PolicyCounters::write(PrometheusText& m) const {
  for (int w = 0; w < 4; ++w) {
    const bool hook = w == kRequestHook;
    for (const CallOutcome o :
         {CallOutcome::picked, CallOutcome::declined, CallOutcome::accepted, CallOutcome::rejected,
          CallOutcome::recheck, CallOutcome::error, CallOutcome::budget}) {
      // rejected: the hook, or a pick, refused with a status of its own.
      const bool pick_only =
          o == CallOutcome::picked || o == CallOutcome::declined || o == CallOutcome::recheck;
      const bool hook_only = o == CallOutcome::accepted;
      if ((hook && pick_only) || (!hook && hook_only))
        continue;
      m.sample("pdgate_policy_calls_total",
               {{"policy", name_}, {"stage", kWhere[w]}, {"outcome", to_string(o)}}, calls(w, o));
    }
  }
}

void PolicyMetrics::write(PrometheusText& m) const {
  std::lock_guard lock(mu_);
  m.counter("pdgate_policy_calls_total",
            "Policy hook calls by policy, stage (encode, prefill, decode picks; request: "
            "on_request) and outcome (picked, declined: nil; accepted; rejected: refused with a "
            "status; recheck: pdgate.RECHECK, asked again; error, budget: failed).");
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

}  // namespace pdgate::policy
