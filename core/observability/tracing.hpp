// Tracing seen from the request path: the spans pdgate makes (one server
// span per client request, one client span per engine call), the sink
// they are handed to (implemented by plugins/otlp_exporter, which exports
// them off the workers' threads), and the trace context every engine
// request carries. docs/tracing.md says what a user sees.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <boost/beast/http/fields.hpp>

#include "core/observability/trace_context.hpp"

namespace pdgate {

// OTLP's span kinds.
enum class SpanKind : int { server = 2, client = 3 };

// Keys are string literals (OpenTelemetry's attribute names): no
// allocation per attribute for them.
struct SpanAttribute {
  std::string_view key;
  std::variant<std::string, std::int64_t> value;
};

// A finished span, as exported.
struct Span {
  TraceId trace_id{};
  SpanId span_id{};
  SpanId parent_id{};  // all zero: the trace's root
  std::string trace_state;
  std::string name;
  SpanKind kind = SpanKind::client;
  std::uint64_t start_ns = 0;  // since the Unix epoch
  std::uint64_t end_ns = 0;
  bool error = false;
  std::string status_message;
  std::vector<SpanAttribute> attributes;
};

struct SpanStats {
  std::uint64_t exported = 0;
  std::uint64_t dropped_queue_full = 0;
  std::uint64_t dropped_export_failed = 0;
};

// Takes finished spans from any worker thread. submit() never blocks and
// never does I/O: a full queue drops the span (counted in stats()).
class SpanSink {
 public:
  virtual ~SpanSink() = default;
  virtual void submit(Span&& span) = 0;
  virtual SpanStats stats() const = 0;
};

std::uint64_t unix_now_ns();

class StageSpan;

// One client request's trace: the client's context (or a new trace when
// it sent none or an invalid one) and the gateway's server span, which
// ends (and is handed to the sink) when this object goes away.
//
// With a sink, every engine call is a span of its own and its request
// names it as the parent. Without one pdgate is not a participant: the
// engines get the client's traceparent as sent (a new trace's when it
// sent none), the same on every stage.
class RequestTrace {
 public:
  RequestTrace(TraceIdSource& ids, SpanSink* sink, double sample_ratio,
               const boost::beast::http::fields& client_headers);
  ~RequestTrace();
  RequestTrace(const RequestTrace&) = delete;
  RequestTrace& operator=(const RequestTrace&) = delete;

  // Whether spans are made and exported for this request.
  bool recording() const { return server_ != nullptr; }
  const TraceId& trace_id() const { return trace_id_; }
  // The traceparent of an engine call that has no span of its own.
  const std::string& traceparent() const { return traceparent_; }
  std::string_view tracestate() const { return tracestate_; }
  std::string_view baggage() const { return baggage_; }

  // The server span's name and attributes (ignored when not recording).
  void name(std::string name);
  void attribute(std::string_view key, std::string value);
  void attribute(std::string_view key, std::int64_t value);
  // How the request ended: the client's status (0: it went away) and the
  // stage that decided it.
  void finish(unsigned status, std::string_view stage);

  // The span of one engine call of `stage` on `url`; `retry` counts the
  // attempts of this stage before it.
  StageSpan stage(const char* stage, const std::string& url, unsigned retry);

 private:
  TraceIdSource& ids_;
  SpanSink* sink_ = nullptr;
  TraceId trace_id_{};
  bool sampled_ = false;
  std::string traceparent_;
  std::string tracestate_;
  std::string baggage_;
  std::unique_ptr<Span> server_;  // null: not recording
};

// One engine call's span; handed to the sink when it ends (end() or the
// destructor), once. A default-constructed or moved-from one records
// nothing.
class StageSpan {
 public:
  StageSpan() = default;
  StageSpan(SpanSink* sink, std::unique_ptr<Span> span, std::string traceparent);
  StageSpan(StageSpan&&) noexcept = default;
  StageSpan& operator=(StageSpan&& other) noexcept;
  StageSpan(const StageSpan&) = delete;
  StageSpan& operator=(const StageSpan&) = delete;
  ~StageSpan() { end(); }

  // What the engine request's traceparent header says.
  const std::string& traceparent() const { return traceparent_; }
  bool recording() const { return span_ != nullptr; }
  void status(unsigned http_status);
  // The call failed: `kind` as core/net/errors.hpp names it.
  void error(std::string_view kind, std::string_view message);
  void attribute(std::string_view key, std::string value);
  void attribute(std::string_view key, std::int64_t value);
  void end();

 private:
  SpanSink* sink_ = nullptr;
  std::unique_ptr<Span> span_;
  std::string traceparent_;
};

}  // namespace pdgate
