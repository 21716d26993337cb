#include "core/pipeline/engine_errors.hpp"

#include "core/pipeline/engine_call.hpp"

namespace pdgate {

namespace {

// What an upstream failure means for the request, in one table: the error
// kind (whose status errors.hpp's table decides), what the client is told
// (never the engine's address), whose fault it is, whether another
// instance may succeed, and whether the engine received the request.
struct FailureMeaning {
  ErrorKind kind;
  const char* reason;
  ErrorSource source = ErrorSource::engine;
  bool retriable = true;
  bool reached_engine = true;
};

FailureMeaning meaning_of(UpstreamFailure f) {
  using K = ErrorKind;
  switch (f) {
    case UpstreamFailure::connect:
      return {K::connect_failed, "cannot connect to the engine", ErrorSource::engine, true, false};
    case UpstreamFailure::connect_timeout:
      return {K::connect_timed_out, "timed out connecting to the engine", ErrorSource::engine, true,
              false};
    case UpstreamFailure::timeout:
      return {K::timed_out, "timed out waiting for the engine"};
    case UpstreamFailure::closed:
      return {K::connection_closed, "the engine closed the connection"};
    case UpstreamFailure::protocol:
      return {K::bad_response, "the engine's response is malformed"};
    case UpstreamFailure::too_large:
      return {K::response_too_large, "the engine's response is too large", ErrorSource::engine,
              false};
    case UpstreamFailure::ejected:
      return {K::ejected, "the engine was taken out of service"};
    case UpstreamFailure::local:
      // The gateway's own shortage (out of descriptors): not the engine's
      // fault, and not retried.
      return {K::out_of_resources, "the gateway is out of resources", ErrorSource::gateway, false,
              false};
    case UpstreamFailure::over_budget:
      // The gateway holds too many whole answers at once: a 503 the
      // client may retry later; no engine is blamed.
      return {K::overloaded, "the gateway's memory for engine answers is used up",
              ErrorSource::gateway, false};
    case UpstreamFailure::aborted:
      return {K::client_gone, "the client went away", ErrorSource::client, false};
    case UpstreamFailure::none:
      break;
  }
  return {K::client_gone, "unknown failure", ErrorSource::client, false};
}

}  // namespace

const char* public_reason(UpstreamFailure kind) {
  return meaning_of(kind).reason;
}

GatewayError upstream_failure(Stage stage, const UpstreamError& e) {
  const FailureMeaning m = meaning_of(e.kind);
  GatewayError g;
  g.kind = m.kind;
  g.stage = to_string(stage);
  g.source = m.source;
  g.retriable = m.retriable;
  g.reached_engine = m.reached_engine;
  const std::string prefix = std::string(g.stage) + " stage failed: ";
  g.message = prefix + m.reason;
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
  const PickRefusal* r = picker.last_refusal();
  if (r == nullptr && !picker.failed_closed())
    return no_instance(stage);
  const std::string policy = std::string("the ") + to_string(stage) + " routing policy";
  const std::string why = r != nullptr ? r->reason : "error";
  GatewayError g;
  if (r != nullptr && r->status != 0) {
    // A refusal the policy chose: its status, message and headers.
    g = policy_error(r->status, r->message);
    g.headers = r->headers;
  } else if (why == "declined") {
    g = policy_error(0, policy + " declined the request (it is fail-closed)");
  } else {
    g = policy_error(0, policy + " failed and is fail-closed",
                     policy + " failed (" + why + ")" +
                         (r != nullptr && !r->message.empty() ? ": " + r->message : ""));
  }
  g.reason = std::string(to_string(stage)) + ":" + why;
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

}  // namespace pdgate
