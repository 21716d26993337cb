// Every failure on the request path is a GatewayError value tagged with
// where it came from; make_error_response() is the one place that turns it
// into an HTTP answer, so status codes and the OpenAI error shape are
// decided once.
#pragma once

#include <string>

#include <boost/beast/http.hpp>

namespace pdgate {

// Who caused the failure. Upstream failures name the stage they broke in.
enum class ErrorSource { client, upstream, internal };

struct GatewayError {
  unsigned status = 500;
  // What the client is told: the stage and the kind of failure, never an
  // engine's address.
  std::string message;
  // The same with what only operators should see (engine URLs, an engine's
  // 5xx text): logged, and sent instead of `message` with --verbose-errors.
  std::string detail;
  ErrorSource source = ErrorSource::internal;
  std::string param;  // the offending field, if any ("" -> null)
  // An upstream's own 4xx answer is relayed verbatim instead of wrapped:
  // the engine's message (prompt too long, unknown model) is what the
  // client needs to see.
  std::string passthrough_body;
  std::string passthrough_content_type;
};

GatewayError client_error(unsigned status, std::string message, std::string param = {});
GatewayError upstream_error(unsigned status, std::string message);

// OpenAI's error "type" for a status ("BadRequestError", ...).
const char* error_type_for(unsigned status);

// {"error": {"message", "type", "param", "code"}}
std::string error_json(unsigned status, std::string_view message, std::string_view param = {});

// The message a client gets for `err`: `detail` when `verbose` and set.
const std::string& client_message(const GatewayError& err, bool verbose);

boost::beast::http::response<boost::beast::http::string_body> make_error_response(
    const GatewayError& err, unsigned http_version, bool keep_alive, bool verbose = false);

}  // namespace pdgate
