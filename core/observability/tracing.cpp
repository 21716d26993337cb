#include "core/observability/tracing.hpp"

#include <chrono>

#include <boost/beast/core/string.hpp>

namespace pdgate {

namespace {

// The client's trace headers (the first of each name), found in one pass
// over its fields (a length check rejects most names at once). Beast knows
// none of the three by enum, so a find() by name hashed the name and walked
// the field set: three lookups per request for headers most requests do
// not carry.
struct TraceHeaders {
  std::string_view traceparent;
  std::string_view tracestate;
  std::string_view baggage;
};

TraceHeaders trace_headers(const boost::beast::http::fields& fields) {
  TraceHeaders t;
  auto take = [](std::string_view& slot, const auto& f) {
    if (slot.data() == nullptr)
      slot = std::string_view(f.value().data(), f.value().size());
  };
  for (const auto& f : fields) {
    const std::string_view name = f.name_string();
    if (name.size() == 11 && boost::beast::iequals(name, "traceparent")) {
      take(t.traceparent, f);
    } else if (name.size() == 10 && boost::beast::iequals(name, "tracestate")) {
      take(t.tracestate, f);
    } else if (name.size() == 7 && boost::beast::iequals(name, "baggage")) {
      take(t.baggage, f);
    }
  }
  return t;
}

// A span that is not recorded (null) takes nothing.
template <class Value>
void add_attribute(Span* span, std::string_view key, Value value) {
  if (span != nullptr)
    span->attributes.push_back({key, std::move(value)});
}

}  // namespace

std::uint64_t unix_now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

RequestTrace::RequestTrace(TraceIdSource& ids, SpanSink* sink, double sample_ratio,
                           const boost::beast::http::fields& client_headers)
    : ids_(ids), sink_(sink) {
  const TraceHeaders headers = trace_headers(client_headers);
  const std::string_view sent = headers.traceparent;
  const auto parent = sent.empty() ? std::nullopt : parse_traceparent(sent);
  SpanId parent_id{};
  if (parent) {
    // A valid parent decides sampling; its tracestate belongs to it (the
    // spec drops tracestate along with an invalid traceparent).
    trace_id_ = parent->trace_id;
    parent_id = parent->parent_id;
    sampled_ = parent->sampled();
    if (auto ts = bounded_tracestate(headers.tracestate))
      tracestate_ = std::string(*ts);
  } else {
    trace_id_ = ids_.trace_id();
    sampled_ = sampled_at_ratio(trace_id_, sample_ratio);
  }
  if (auto b = bounded_baggage(headers.baggage))
    baggage_ = std::string(*b);
  if (sink_ == nullptr) {
    // Not a participant: pass the context on as it came.
    traceparent_ =
        parent ? std::string(sent) : format_traceparent(trace_id_, ids_.span_id(), sampled_);
    return;
  }
  const SpanId server_id = ids_.span_id();
  traceparent_ = format_traceparent(trace_id_, server_id, sampled_);
  if (!sampled_)
    return;
  server_ = std::make_unique<Span>();
  server_->trace_id = trace_id_;
  server_->span_id = server_id;
  server_->parent_id = parent_id;
  server_->trace_state = tracestate_;
  server_->kind = SpanKind::server;
  server_->attributes.reserve(6);
  server_->start_ns = unix_now_ns();
}

RequestTrace::~RequestTrace() {
  if (server_) {
    server_->end_ns = unix_now_ns();
    sink_->submit(std::move(*server_));
  }
}

void RequestTrace::name(std::string name) {
  if (server_)
    server_->name = std::move(name);
}

void RequestTrace::attribute(std::string_view key, std::string value) {
  add_attribute(server_.get(), key, std::move(value));
}

void RequestTrace::attribute(std::string_view key, std::int64_t value) {
  add_attribute(server_.get(), key, value);
}

void RequestTrace::finish(unsigned status, std::string_view stage) {
  if (!server_)
    return;
  // 499: the client went away before its answer (as nginx logs it).
  attribute("http.response.status_code", static_cast<std::int64_t>(status != 0 ? status : 499));
  attribute("pdgate.stage", std::string(stage));
  if (status == 0 || status >= 500) {
    server_->error = true;
    server_->status_message =
        status == 0 ? "the client went away" : std::string(stage) + " stage failed";
  }
}

StageSpan RequestTrace::stage(const char* stage, const std::string& url, unsigned retry) {
  if (sink_ == nullptr)
    return StageSpan(nullptr, nullptr, traceparent_);
  const SpanId id = ids_.span_id();
  std::string traceparent = format_traceparent(trace_id_, id, sampled_);
  if (!server_)
    return StageSpan(nullptr, nullptr, std::move(traceparent));
  auto span = std::make_unique<Span>();
  span->trace_id = trace_id_;
  span->span_id = id;
  span->parent_id = server_->span_id;
  span->trace_state = tracestate_;
  span->name = stage;
  span->kind = SpanKind::client;
  span->start_ns = unix_now_ns();
  span->attributes.reserve(6);
  span->attributes.push_back({"pdgate.stage", std::string(stage)});
  span->attributes.push_back({"url.full", url});
  span->attributes.push_back({"pdgate.retry", static_cast<std::int64_t>(retry)});
  return StageSpan(sink_, std::move(span), std::move(traceparent));
}

StageSpan::StageSpan(SpanSink* sink, std::unique_ptr<Span> span, std::string traceparent)
    : sink_(sink), span_(std::move(span)), traceparent_(std::move(traceparent)) {}

StageSpan& StageSpan::operator=(StageSpan&& other) noexcept {
  if (this != &other) {
    end();
    sink_ = other.sink_;
    span_ = std::move(other.span_);
    traceparent_ = std::move(other.traceparent_);
  }
  return *this;
}

void StageSpan::status(unsigned http_status) {
  attribute("http.response.status_code", static_cast<std::int64_t>(http_status));
}

void StageSpan::error(std::string_view kind, std::string_view message) {
  if (!span_)
    return;
  span_->error = true;
  span_->status_message = std::string(message);
  attribute("error.type", std::string(kind));
}

void StageSpan::attribute(std::string_view key, std::string value) {
  add_attribute(span_.get(), key, std::move(value));
}

void StageSpan::attribute(std::string_view key, std::int64_t value) {
  add_attribute(span_.get(), key, value);
}

void StageSpan::end() {
  if (!span_)
    return;
  span_->end_ns = unix_now_ns();
  sink_->submit(std::move(*span_));
  span_.reset();
}

}  // namespace pdgate
