#include "core/net/errors.hpp"

#include <nlohmann/json.hpp>

namespace pdgate {

namespace http = boost::beast::http;

const char* to_string(ErrorSource s) {
  switch (s) {
    case ErrorSource::client:
      return "client";
    case ErrorSource::engine:
      return "engine";
    case ErrorSource::gateway:
      return "gateway";
    case ErrorSource::policy:
      return "policy";
  }
  return "?";
}

const char* to_string(ErrorKind k) {
  switch (k) {
    case ErrorKind::bad_request:
      return "bad_request";
    case ErrorKind::unsupported_media_type:
      return "unsupported_media_type";
    case ErrorKind::body_too_large:
      return "body_too_large";
    case ErrorKind::header_too_large:
      return "header_too_large";
    case ErrorKind::forbidden:
      return "forbidden";
    case ErrorKind::not_found:
      return "not_found";
    case ErrorKind::conflict:
      return "conflict";
    case ErrorKind::unprocessable:
      return "unprocessable";
    case ErrorKind::method_not_allowed:
      return "method_not_allowed";
    case ErrorKind::not_implemented:
      return "not_implemented";
    case ErrorKind::unauthenticated:
      return "unauthenticated";
    case ErrorKind::rate_limited:
      return "rate_limited";
    case ErrorKind::limiter_unavailable:
      return "limiter_unavailable";
    case ErrorKind::policy_rejected:
      return "policy_rejected";
    case ErrorKind::policy_failed:
      return "policy_failed";
    case ErrorKind::engine_rejected:
      return "engine_rejected";
    case ErrorKind::engine_failed:
      return "engine_failed";
    case ErrorKind::connect_failed:
      return "connect_failed";
    case ErrorKind::connect_timed_out:
      return "connect_timed_out";
    case ErrorKind::timed_out:
      return "timed_out";
    case ErrorKind::connection_closed:
      return "connection_closed";
    case ErrorKind::bad_response:
      return "bad_response";
    case ErrorKind::response_too_large:
      return "response_too_large";
    case ErrorKind::ejected:
      return "ejected";
    case ErrorKind::no_instance:
      return "no_instance";
    case ErrorKind::out_of_resources:
      return "out_of_resources";
    case ErrorKind::overloaded:
      return "overloaded";
    case ErrorKind::misconfigured:
      return "misconfigured";
    case ErrorKind::loop:
      return "loop";
    case ErrorKind::internal:
      return "internal";
    case ErrorKind::client_gone:
      return "client_gone";
  }
  return "?";
}

unsigned status_of(const GatewayError& e) {
  switch (e.kind) {
    case ErrorKind::bad_request:
      return 400;
    case ErrorKind::unsupported_media_type:
      return 415;
    case ErrorKind::body_too_large:
      return 413;
    case ErrorKind::header_too_large:
      return 431;
    case ErrorKind::forbidden:
      return 403;
    case ErrorKind::not_found:
      return 404;
    case ErrorKind::conflict:
      return 409;
    case ErrorKind::unprocessable:
      return 422;
    case ErrorKind::method_not_allowed:
      return 405;
    case ErrorKind::not_implemented:
      return 501;
    case ErrorKind::unauthenticated:
      return 401;
    case ErrorKind::rate_limited:
      return 429;
    case ErrorKind::limiter_unavailable:
      return 503;
    case ErrorKind::policy_rejected:
      // Checked again here: a status outside 4xx/5xx is the policy's bug.
      return e.policy_status >= 400 && e.policy_status <= 599 ? e.policy_status : 500;
    case ErrorKind::policy_failed:
      return 503;
    case ErrorKind::engine_rejected:
      // The engine's own 4xx, as it answered.
      return e.engine_status >= 400 && e.engine_status < 500 ? e.engine_status : 400;
    case ErrorKind::engine_failed:
    case ErrorKind::connect_failed:
    case ErrorKind::connect_timed_out:
    case ErrorKind::timed_out:
    case ErrorKind::connection_closed:
    case ErrorKind::bad_response:
    case ErrorKind::response_too_large:
    case ErrorKind::ejected:
      return 502;
    case ErrorKind::no_instance:
    case ErrorKind::out_of_resources:
    case ErrorKind::overloaded:
    case ErrorKind::misconfigured:
      return 503;
    case ErrorKind::loop:
      return 508;
    case ErrorKind::internal:
      return 500;
    case ErrorKind::client_gone:
      return 499;
  }
  return 500;
}

GatewayError client_error(ErrorKind kind, std::string message, std::string param) {
  GatewayError e;
  e.kind = kind;
  e.source = ErrorSource::client;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

GatewayError policy_error(unsigned status, std::string message, std::string detail) {
  GatewayError e;
  e.kind = status == 0 ? ErrorKind::policy_failed : ErrorKind::policy_rejected;
  e.source = ErrorSource::policy;
  e.stage = "policy";
  e.policy_status = status;
  e.message = std::move(message);
  e.detail = std::move(detail);
  return e;
}

GatewayError gateway_error(ErrorKind kind, std::string message, std::string detail) {
  GatewayError e;
  e.kind = kind;
  e.source = ErrorSource::gateway;
  e.message = std::move(message);
  e.detail = std::move(detail);
  return e;
}

GatewayError engine_error(ErrorKind kind, const char* stage, std::string message,
                          std::string detail) {
  GatewayError e;
  e.kind = kind;
  e.source = ErrorSource::engine;
  e.stage = stage;
  e.reached_engine = true;
  e.message = std::move(message);
  e.detail = std::move(detail);
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
    case 501:
      return "NotImplementedError";
    case 502:
      return "BadGatewayError";
    case 503:
      return "ServiceUnavailableError";
    case 504:
      return "GatewayTimeoutError";
    case 508:
      return "LoopDetectedError";
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
  const unsigned status = status_of(err);
  http::response<http::string_body> res{static_cast<http::status>(status), http_version};
  res.set(http::field::server, "pdgate");
  if (!err.passthrough_body.empty()) {
    res.set(http::field::content_type, err.passthrough_content_type.empty()
                                           ? "application/json"
                                           : err.passthrough_content_type);
    res.body() = err.passthrough_body;
  } else {
    res.set(http::field::content_type, "application/json");
    res.body() = error_json(status, client_message(err, verbose), err.param);
  }
  for (const auto& [name, value] : err.headers)
    res.set(name, value);
  if (err.retry_after_seconds > 0)
    res.set(http::field::retry_after, std::to_string(err.retry_after_seconds));
  else if (err.kind == ErrorKind::overloaded || err.kind == ErrorKind::limiter_unavailable)
    res.set(http::field::retry_after, "1");
  if (err.kind == ErrorKind::unauthenticated)
    res.set(http::field::www_authenticate, "Bearer");
  res.keep_alive(keep_alive);
  res.prepare_payload();
  return res;
}

http::response<http::string_body> make_error_response(unsigned status, std::string_view message,
                                                      unsigned http_version, bool keep_alive) {
  http::response<http::string_body> res{static_cast<http::status>(status), http_version};
  res.set(http::field::server, "pdgate");
  res.set(http::field::content_type, "application/json");
  res.body() = error_json(status, message);
  res.keep_alive(keep_alive);
  res.prepare_payload();
  return res;
}

}  // namespace pdgate
