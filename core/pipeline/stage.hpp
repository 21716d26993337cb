// What every stage of the pipeline (encode, prefill, decode) shares: how an
// upstream request is built, how an engine's failure becomes a
// GatewayError, who is blamed for it, the failover budget, and the report
// each stage gives the picker.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http.hpp>
#include "core/net/maybe_tls_stream.hpp"

#include "core/base/json_body.hpp"
#include "core/net/errors.hpp"
#include "core/observability/tracing.hpp"
#include "core/pipeline/worker.hpp"
#include "core/upstream/instance.hpp"
#include "core/upstream/upstream.hpp"

namespace pdgate {

// Engines' error bodies are short messages.
inline constexpr std::size_t kMaxErrorBody = 1u << 20;

// What every upstream request made for one client request carries from
// it: the credentials, the Via chain that lets gateways detect loops
// (core/net/loop_guard.hpp), the trace context (core/observability/tracing.hpp), who the
// client is (X-Forwarded-For, Forwarded) and the extra headers the
// configuration names (--forward-headers, --set-header).
struct ForwardedHeaders {
  std::string authorization;  // the client's, else the OPENAI_API_KEY default
  std::string via;
  std::string traceparent;  // of engine calls without a span of their own
  std::string tracestate;
  std::string baggage;
  std::string x_forwarded_for;
  std::string forwarded;
  // Names from the Config (which outlives every request), values copied.
  std::vector<std::pair<std::string_view, std::string>> extra;
  // Set by the request hook (core/pipeline/request_hook_phase.hpp).
  std::vector<std::pair<std::string, std::string>> policy_set;
};

// Computed once per client request; `client` is its connection (the
// peer's address goes into X-Forwarded-For and Forwarded).
ForwardedHeaders forwarded_headers(const WorkerContext& w,
                                   const http::request<http::string_body>& req,
                                   const MaybeTlsStream& client, const RequestTrace& trace);

// `traceparent`, when given, is the engine call's own (its span's); else
// fwd.traceparent is sent.
http::request<http::string_body> upstream_request(http::verb method, const Instance& inst,
                                                  std::string_view target, std::string body,
                                                  const std::string& request_id,
                                                  const ForwardedHeaders& fwd,
                                                  std::string_view traceparent = {});

// The same request's head alone, rendered (request line, fields, empty
// line), for a body of `body_size` bytes sent as a buffer sequence
// (UpstreamExchange::start with buffers). Written directly: Beast's field
// container allocates per field, and this runs twice per request.
std::string upstream_head(http::verb method, const Instance& inst, std::string_view target,
                          std::size_t body_size, const std::string& request_id,
                          const ForwardedHeaders& fwd, std::string_view traceparent = {});

// The engine call failed with `e`: its span says how.
void trace_error(StageSpan& span, const GatewayError& e);
// The token counts of an engine's whole JSON answer (its `usage`), on the
// call's span; nothing when the span is not recorded or has none.
void trace_usage(StageSpan& span, std::string_view answer);

// The pieces of a spliced body as buffers for a gathering write.
std::vector<net::const_buffer> body_buffers(const SplicedText& body);

// The first `max` bytes of `s`, "..." when cut.
std::string snippet(std::string_view s, std::size_t max = 300);

// What a client is told an upstream failure was, without the engine's
// address ("timed out waiting for the engine").
const char* public_reason(UpstreamFailure kind);

// An exchange with `inst` failed: "<stage> stage failed: <public reason>",
// the engine named only in the detail. Whose fault, and whether another
// instance may succeed, follow from the failure: a request that never
// reached the engine is retriable for free; the gateway's own shortage
// (out of descriptors) is not the engine's fault and not retried.
GatewayError upstream_failure(Stage stage, const UpstreamError& e);

// 503 "no healthy <stage> instance is available".
GatewayError no_instance(Stage stage);
// The same after `picker` returned no instance: 503 from the policy when
// it failed and is fail-closed.
GatewayError no_instance(Stage stage, const InstancePicker& picker);

// An engine answered with an error status: its own 4xx goes to the client
// verbatim (engine_rejected), a 5xx becomes a 502 naming the stage
// (engine_failed, retriable). Reads the error body.
net::awaitable<GatewayError> engine_status_error(Stage stage, UpstreamExchange& ex,
                                                 const Instance& inst);

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

// Reports a stage's outcome to the picker that chose its instance, when the
// stage ends however it ends (policies learn from failures too).
class StageReport {
 public:
  StageReport(InstancePicker& picker, const InstancePtr& inst, const PickContext& ctx)
      : picker_(picker), inst_(inst), ctx_(ctx), start_(std::chrono::steady_clock::now()) {
    outcome_.stage = ctx.stage;
  }
  StageReport(const StageReport&) = delete;
  StageReport& operator=(const StageReport&) = delete;
  ~StageReport() {
    outcome_.total = since_start();
    picker_.on_complete(*inst_, ctx_, outcome_);
  }
  void header(unsigned status) {
    outcome_.status = status;
    outcome_.time_to_header = since_start();
  }
  // The stage's first token arrived at `at` (see PickOutcome).
  void first_token(std::chrono::steady_clock::time_point at) {
    outcome_.time_to_first_token =
        std::chrono::duration_cast<std::chrono::microseconds>(at - start_);
  }
  void first_token() { first_token(std::chrono::steady_clock::now()); }
  std::chrono::steady_clock::time_point started() const { return start_; }
  void succeeded() { outcome_.ok = true; }

 private:
  std::chrono::microseconds since_start() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                                 start_);
  }
  InstancePicker& picker_;
  InstancePtr inst_;
  const PickContext& ctx_;
  std::chrono::steady_clock::time_point start_;
  PickOutcome outcome_;
};

}  // namespace pdgate
