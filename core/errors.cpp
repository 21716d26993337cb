#include "core/errors.hpp"

#include <nlohmann/json.hpp>

namespace pdgate {

namespace http = boost::beast::http;

GatewayError client_error(unsigned status, std::string message, std::string param) {
  GatewayError e;
  e.status = status;
  e.message = std::move(message);
  e.source = ErrorSource::client;
  e.param = std::move(param);
  return e;
}

GatewayError upstream_error(unsigned status, std::string message) {
  GatewayError e;
  e.status = status;
  e.message = std::move(message);
  e.source = ErrorSource::upstream;
  return e;
}

const char* error_type_for(unsigned status) {
  switch (status) {
    case 400:
      return "BadRequestError";
    case 401:
      return "AuthenticationError";
    case 403:
      return "PermissionDeniedError";
    case 404:
      return "NotFoundError";
    case 405:
      return "MethodNotAllowedError";
    case 408:
      return "RequestTimeoutError";
    case 409:
      return "ConflictError";
    case 413:
      return "RequestTooLargeError";
    case 415:
      return "UnsupportedMediaTypeError";
    case 422:
      return "UnprocessableEntityError";
    case 429:
      return "RateLimitError";
    case 431:
      return "RequestHeaderFieldsTooLargeError";
    case 502:
      return "BadGatewayError";
    case 503:
      return "ServiceUnavailableError";
    case 504:
      return "GatewayTimeoutError";
    default:
      return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

std::string error_json(unsigned status, std::string_view message, std::string_view param) {
  nlohmann::json j = {{"error",
                       {{"message", message},
                        {"type", error_type_for(status)},
                        {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                        {"code", status}}}};
  // Replace rather than throw on invalid UTF-8: messages can quote
  // upstream bytes, and an error path must not fail itself.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

const std::string& client_message(const GatewayError& err, bool verbose) {
  return verbose && !err.detail.empty() ? err.detail : err.message;
}

http::response<http::string_body> make_error_response(const GatewayError& err,
                                                      unsigned http_version, bool keep_alive,
                                                      bool verbose) {
  http::response<http::string_body> res{static_cast<http::status>(err.status), http_version};
  res.set(http::field::server, "pdgate");
  if (!err.passthrough_body.empty()) {
    res.set(http::field::content_type, err.passthrough_content_type.empty()
                                           ? "application/json"
                                           : err.passthrough_content_type);
    res.body() = err.passthrough_body;
  } else {
    res.set(http::field::content_type, "application/json");
    res.body() = error_json(err.status, client_message(err, verbose), err.param);
  }
  res.keep_alive(keep_alive);
  res.prepare_payload();
  return res;
}

}  // namespace pdgate
