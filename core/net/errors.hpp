// Every failure on the request path is a GatewayError value: what kind of
// failure, whose fault (the client's, an engine's, the gateway's, a
// policy's), in which stage, and whether another instance may succeed.
// status_of() is the one table from a failure to its HTTP status, and
// make_error_response() the one place that turns it into an answer, so
// status codes and the OpenAI error shape are decided once.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/beast/http.hpp>

namespace pdgate {

// Who caused the failure.
enum class ErrorSource { client, engine, gateway, policy };
const char* to_string(ErrorSource s);

enum class ErrorKind {
  // The client's request.
  bad_request,             // 400
  unsupported_media_type,  // 415
  body_too_large,          // 413
  header_too_large,        // 431
  forbidden,               // 403: e.g. an instance outside --allowed-upstreams
  not_found,               // 404
  method_not_allowed,      // 405
  conflict,                // 409: e.g. an instance that is registered already
  unprocessable,           // 422: well-formed, but fails a check (a model not served)
  not_implemented,         // 501: a transfer coding pdgate does not decode
  unauthenticated,         // 401: no API key, or an unknown one (--api-keys)
  rate_limited,            // 429: over a key's limit; Retry-After says when to come back
  // An engine.
  engine_rejected,     // it answered 4xx: relayed as it is
  engine_failed,       // it answered 5xx: 502
  connect_failed,      // refused, unresolvable: 502, the request never reached it
  connect_timed_out,   // no answer to the connect: 502, never reached it
  timed_out,           // no (more) answer within the first-byte timeout: 502
  connection_closed,   // the answer was cut short: 502
  bad_response,        // malformed (HTTP, SSE, JSON): 502
  response_too_large,  // 502
  ejected,             // taken out of service while the request waited: 502
  // A routing policy.
  policy_rejected,  // the request hook refused it: the status it chose (policy_status)
  policy_failed,    // 503: a fail-closed policy failed (error, budget, bad answer)
  // The gateway.
  no_instance,          // 503: no usable instance for the stage
  out_of_resources,     // 503: no file descriptor or memory to reach an engine
  overloaded,           // 503: too many large bodies being received
  misconfigured,        // 503: e.g. p2p-nccl without the peer's ZMQ address
  limiter_unavailable,  // 503: the shared limiter did not answer (fail closed)
  loop,                 // 508: the request came back round
  internal,             // 500
  client_gone,          // 499 (nothing is sent: the client left)
};
const char* to_string(ErrorKind k);

struct GatewayError {
  ErrorKind kind = ErrorKind::internal;
  ErrorSource source = ErrorSource::gateway;
  // The stage that decided the answer: "gateway", "encode", "prefill" or
  // "decode" (the `stage` label of pdgate_requests_total).
  const char* stage = "gateway";
  // Another instance of the stage may succeed (the engine's fault, and the
  // client has received nothing).
  bool retriable = false;
  // False when no engine received the request: sending it elsewhere costs
  // the engines nothing.
  bool reached_engine = false;
  unsigned engine_status = 0;  // what the engine answered, if it did
  // What the client is told: the stage and the kind of failure, never an
  // engine's address.
  std::string message;
  // The same with what only operators should see (engine URLs, an engine's
  // 5xx text): logged, and sent instead of `message` with --verbose-errors.
  std::string detail;
  std::string param;  // the offending field, if any ("" -> null)
  // An engine's own 4xx answer is relayed verbatim instead of wrapped: the
  // engine's message (prompt too long, unknown model) is what the client
  // needs to see.
  std::string passthrough_body;
  std::string passthrough_content_type;
  // policy_rejected's status (400..599), chosen by the script.
  unsigned policy_status = 0;
  // Seconds for a Retry-After header (0: none, unless the kind implies one).
  unsigned retry_after_seconds = 0;
  // A policy's refusal: why, for the access log ("decode:declined",
  // "request:rejected", "prefill:error", ...), and the response headers
  // it chose (Retry-After, x-*; checked and bounded by the policy engine).
  std::string reason;
  std::vector<std::pair<std::string, std::string>> headers;
};

// The HTTP status the client gets for `e`.
unsigned status_of(const GatewayError& e);

// A failure of the client's request (bad_request, too large, ...).
GatewayError client_error(ErrorKind kind, std::string message, std::string param = {});
// A failure of the gateway itself (no_instance, overloaded, loop, ...).
GatewayError gateway_error(ErrorKind kind, std::string message, std::string detail = {});
// An engine's answer that cannot be used (bad_response, ...), in `stage`:
// it reached the engine; `detail` names it.
GatewayError engine_error(ErrorKind kind, const char* stage, std::string message,
                          std::string detail);

// A policy's answer: the request hook rejected the request with `status`
// (400..599; anything else is 500), or a fail-closed policy failed
// (status 0 -> policy_failed, 503).
GatewayError policy_error(unsigned status, std::string message, std::string detail = {});

// OpenAI's error "type" for a status ("BadRequestError", ...).
const char* error_type_for(unsigned status);

// {"error": {"message", "type", "param", "code"}}
std::string error_json(unsigned status, std::string_view message, std::string_view param = {});

// The message a client gets for `err`: `detail` when `verbose` and set.
const std::string& client_message(const GatewayError& err, bool verbose);

boost::beast::http::response<boost::beast::http::string_body> make_error_response(
    const GatewayError& err, unsigned http_version, bool keep_alive, bool verbose = false);

// For answers that are not request-path failures (the admin API's 401,
// 409, 422...): the same body shape with a given status.
boost::beast::http::response<boost::beast::http::string_body> make_error_response(
    unsigned status, std::string_view message, unsigned http_version, bool keep_alive);

}  // namespace pdgate
