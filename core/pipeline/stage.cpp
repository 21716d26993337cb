#include "core/pipeline/stage.hpp"

#include <algorithm>
#include <charconv>

#include <spdlog/spdlog.h>

#include "core/net/http_head.hpp"

namespace pdgate {

namespace {

// Every value of a header the client may have sent on several lines, as
// one comma-separated list (RFC 9110 5.3).
std::string joined_values(const http::request<http::string_body>& req, std::string_view name) {
  std::string out;
  const auto [first, last] = req.equal_range(name);
  for (auto it = first; it != last; ++it) {
    if (!out.empty())
      out += ", ";
    out += it->value();
  }
  return out;
}

// "a" + ", " + "b", or "b" when there is no "a".
std::string appended(std::string list, std::string_view item) {
  if (!list.empty())
    list += ", ";
  list += item;
  return list;
}

}  // namespace

ForwardedHeaders forwarded_headers(const WorkerContext& w,
                                   const http::request<http::string_body>& req,
                                   const MaybeTlsStream& client, const RequestTrace& trace) {
  ForwardedHeaders f;
  // The client's fields that are passed on or extended, in one pass (the
  // first Authorization and Via, as find() gives them; every line of
  // X-Forwarded-For and Forwarded, in order). Beast has no enum for the
  // last two, so each lookup by name hashed it and walked the field set.
  const http::fields::value_type* authorization = nullptr;
  std::string_view incoming_via;
  bool has_via = false;
  std::string client_xff;
  std::string client_forwarded;
  for (const auto& field : req) {
    const http::field name = field.name();
    if (name == http::field::authorization) {
      if (authorization == nullptr)
        authorization = &field;
    } else if (name == http::field::via) {
      if (!has_via)
        incoming_via = field.value();
      has_via = true;
    } else {
      const std::string_view s = field.name_string();
      if (s.size() == 15 && beast::iequals(s, "x-forwarded-for")) {
        client_xff = appended(std::move(client_xff), field.value());
      } else if (s.size() == 9 && beast::iequals(s, "forwarded")) {
        client_forwarded = appended(std::move(client_forwarded), field.value());
      }
    }
  }
  // With gateway API keys the client's key is the gateway's to check, not
  // the engines' to see: engines get OPENAI_API_KEY's (or nothing).
  f.authorization = authorization != nullptr && w.client_keys == nullptr
                        ? std::string(authorization->value())
                        : w.default_authorization;
  if (w.loop_guard != nullptr)
    f.via = w.loop_guard->via_for_upstream(incoming_via);
  f.traceparent = trace.traceparent();
  f.tracestate = trace.tracestate();
  f.baggage = trace.baggage();
  if (const std::string& ip = client.peer_address(); !ip.empty()) {
    f.x_forwarded_for = appended(std::move(client_xff), ip);
    // RFC 7239: an IPv6 node is quoted and bracketed. (Appended in place:
    // a temporary for the element cost an allocation per request.)
    f.forwarded = std::move(client_forwarded);
    f.forwarded.reserve(f.forwarded.size() + ip.size() + 24);
    if (!f.forwarded.empty())
      f.forwarded += ", ";
    const bool v6 = client.peer_is_v6();
    f.forwarded += v6 ? "for=\"[" : "for=";
    f.forwarded += ip;
    f.forwarded += v6 ? "]\";proto=http" : ";proto=http";
  }
  for (const auto& name : w.cfg.forward_headers) {
    if (req.find(name) != req.end())
      f.extra.emplace_back(name, joined_values(req, name));
  }
  for (const auto& [name, value] : w.cfg.set_headers)
    f.extra.emplace_back(name, value);
  return f;
}

namespace {

// The fields every upstream request carries, in the order Beast would
// write them.
template <class Sink>
void upstream_fields(Sink&& add, const Instance& inst, const std::string& request_id,
                     const ForwardedHeaders& fwd, std::string_view traceparent) {
  add("Host", inst.host_port);
  add("User-Agent", "pdgate");
  add("X-Request-Id", request_id);
  if (!fwd.authorization.empty())
    add("Authorization", fwd.authorization);
  if (!fwd.via.empty())
    add("Via", fwd.via);
  if (traceparent.empty())
    traceparent = fwd.traceparent;
  if (!traceparent.empty())
    add("traceparent", traceparent);
  if (!fwd.tracestate.empty())
    add("tracestate", fwd.tracestate);
  if (!fwd.baggage.empty())
    add("baggage", fwd.baggage);
  if (!fwd.x_forwarded_for.empty())
    add("X-Forwarded-For", fwd.x_forwarded_for);
  if (!fwd.forwarded.empty())
    add("Forwarded", fwd.forwarded);
  for (const auto& [name, value] : fwd.extra)
    add(name, value);
  for (const auto& [name, value] : fwd.policy_set)
    add(name, value);
}

}  // namespace

std::string upstream_head(http::verb method, const Instance& inst, std::string_view target,
                          std::size_t body_size, const std::string& request_id,
                          const ForwardedHeaders& fwd, std::string_view traceparent) {
  const bool post = method == http::verb::post;
  char digits[24];
  const std::string_view length(
      digits, post ? static_cast<std::size_t>(
                         std::to_chars(digits, digits + sizeof digits, body_size).ptr - digits)
                   : 0);
  return assemble_head([&](auto&& put) {
    put(http::to_string(method));
    put(" ");
    put(target);
    put(" HTTP/1.1\r\n");
    upstream_fields(
        [&put](std::string_view name, std::string_view value) {
          put(name);
          put(": ");
          put(value);
          put("\r\n");
        },
        inst, request_id, fwd, traceparent);
    if (post) {
      put("Content-Type: application/json\r\nContent-Length: ");
      put(length);
      put("\r\n");
    }
    put("\r\n");
  });
}

http::request<http::string_body> upstream_request(http::verb method, const Instance& inst,
                                                  std::string_view target, std::string body,
                                                  const std::string& request_id,
                                                  const ForwardedHeaders& fwd,
                                                  std::string_view traceparent) {
  http::request<http::string_body> r{method, target, 11};
  upstream_fields([&r](std::string_view name, std::string_view value) { r.insert(name, value); },
                  inst, request_id, fwd, traceparent);
  if (method == http::verb::post)
    r.set(http::field::content_type, "application/json");
  r.keep_alive(true);
  r.body() = std::move(body);
  r.prepare_payload();
  return r;
}

void trace_error(StageSpan& span, const GatewayError& e) {
  span.error(to_string(e.kind), e.message);
}

namespace {

// The raw `usage` object of an engine's JSON answer, found from the end
// (engines write it last) without indexing the whole answer: the answer
// can be long, and this runs on the request path. A quoted "usage"
// followed by ':' can only be a key: inside a JSON string its quotes
// would be escaped.
std::optional<std::string_view> usage_object(std::string_view answer) {
  const std::size_t key = answer.rfind("\"usage\"");
  if (key == std::string_view::npos)
    return std::nullopt;
  std::size_t i = key + 7;
  while (i < answer.size() && (answer[i] == ' ' || answer[i] == '\n' || answer[i] == '\r' ||
                               answer[i] == '\t' || answer[i] == ':'))
    ++i;
  if (i >= answer.size() || answer[i] != '{')
    return std::nullopt;
  // Its members are numbers and objects of numbers (no strings).
  int depth = 0;
  for (std::size_t j = i; j < answer.size(); ++j) {
    if (answer[j] == '{') {
      ++depth;
    } else if (answer[j] == '}' && --depth == 0) {
      return answer.substr(i, j + 1 - i);
    }
  }
  return std::nullopt;
}

}  // namespace

void trace_usage(StageSpan& span, std::string_view answer) {
  if (!span.recording())
    return;
  const auto usage = usage_object(answer);
  if (!usage)
    return;
  const auto counts = index_json_object(*usage);
  if (!counts)
    return;
  const std::pair<std::string_view, const char*> names[] = {
      {"prompt_tokens", "gen_ai.usage.input_tokens"},
      {"completion_tokens", "gen_ai.usage.output_tokens"}};
  for (const auto& [member, attribute] : names) {
    const auto raw = raw_member(*usage, *counts, member);
    std::int64_t n = 0;
    if (raw && std::from_chars(raw->data(), raw->data() + raw->size(), n).ec == std::errc())
      span.attribute(attribute, n);
  }
}

std::vector<net::const_buffer> body_buffers(const SplicedText& body) {
  std::vector<net::const_buffer> out;
  out.reserve(body.piece_count());
  body.for_each([&](std::string_view piece) { out.emplace_back(piece.data(), piece.size()); });
  return out;
}

std::string snippet(std::string_view s, std::size_t max) {
  std::string out(s.substr(0, max));
  if (s.size() > max)
    out += "...";
  return out;
}

const char* public_reason(UpstreamFailure kind) {
  switch (kind) {
    case UpstreamFailure::connect:
      return "cannot connect to the engine";
    case UpstreamFailure::connect_timeout:
      return "timed out connecting to the engine";
    case UpstreamFailure::timeout:
      return "timed out waiting for the engine";
    case UpstreamFailure::closed:
      return "the engine closed the connection";
    case UpstreamFailure::protocol:
      return "the engine's response is malformed";
    case UpstreamFailure::too_large:
      return "the engine's response is too large";
    case UpstreamFailure::local:
      return "the gateway is out of resources";
    case UpstreamFailure::ejected:
      return "the engine was taken out of service";
    case UpstreamFailure::aborted:
      return "the client went away";
    case UpstreamFailure::none:
      break;
  }
  return "unknown failure";
}

GatewayError upstream_failure(Stage stage, const UpstreamError& e) {
  GatewayError g;
  g.stage = to_string(stage);
  g.source = ErrorSource::engine;
  g.retriable = true;
  g.reached_engine = true;
  switch (e.kind) {
    case UpstreamFailure::connect:
      g.kind = ErrorKind::connect_failed;
      g.reached_engine = false;
      break;
    case UpstreamFailure::connect_timeout:
      g.kind = ErrorKind::connect_timed_out;
      g.reached_engine = false;
      break;
    case UpstreamFailure::timeout:
      g.kind = ErrorKind::timed_out;
      break;
    case UpstreamFailure::closed:
      g.kind = ErrorKind::connection_closed;
      break;
    case UpstreamFailure::protocol:
      g.kind = ErrorKind::bad_response;
      break;
    case UpstreamFailure::too_large:
      g.kind = ErrorKind::response_too_large;
      g.retriable = false;
      break;
    case UpstreamFailure::ejected:
      g.kind = ErrorKind::ejected;
      break;
    case UpstreamFailure::local:
      g.kind = ErrorKind::out_of_resources;
      g.source = ErrorSource::gateway;
      g.retriable = false;
      g.reached_engine = false;
      break;
    case UpstreamFailure::aborted:
    case UpstreamFailure::none:
      g.kind = ErrorKind::client_gone;
      g.source = ErrorSource::client;
      g.retriable = false;
      break;
  }
  const std::string prefix = std::string(g.stage) + " stage failed: ";
  g.message = prefix + public_reason(e.kind);
  g.detail = prefix + e.detail;
  return g;
}

GatewayError no_instance(Stage stage) {
  GatewayError g =
      gateway_error(ErrorKind::no_instance,
                    std::string("no healthy ") + to_string(stage) + " instance is available");
  g.stage = to_string(stage);
  return g;
}

GatewayError no_instance(Stage stage, const InstancePicker& picker) {
  if (!picker.failed_closed())
    return no_instance(stage);
  GatewayError g = policy_error(
      0, std::string("the ") + to_string(stage) + " routing policy failed and is fail-closed");
  g.stage = to_string(stage);
  return g;
}

net::awaitable<GatewayError> engine_status_error(Stage stage, UpstreamExchange& ex,
                                                 const Instance& inst) {
  std::string body;
  auto err = co_await ex.read_all(body, kMaxErrorBody);
  const unsigned status = ex.status();
  GatewayError g;
  g.stage = to_string(stage);
  g.source = ErrorSource::engine;
  g.reached_engine = true;
  g.engine_status = status;
  const std::string answered = " the engine answered " + std::to_string(status);
  const std::string named = " " + inst.spec.url + " answered " + std::to_string(status);
  if (status >= 400 && status < 500) {
    // The request's own fault (prompt too long, unknown model): relayed.
    g.kind = ErrorKind::engine_rejected;
    g.source = ErrorSource::client;
    g.message = std::string(g.stage) + " stage:" + answered;
    g.detail = std::string(g.stage) + " stage:" + named;
    if (!err && !body.empty()) {
      g.passthrough_body = std::move(body);
      if (!ex.content_type().empty())
        g.passthrough_content_type = ex.content_type();
    }
    co_return g;
  }
  g.kind = ErrorKind::engine_failed;
  g.retriable = status >= 500;
  g.message = std::string(g.stage) + " stage failed:" + answered;
  g.detail = std::string(g.stage) + " stage failed:" + named + ": " + snippet(body);
  co_return g;
}

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
