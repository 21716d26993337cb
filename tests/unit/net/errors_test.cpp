// The one table from a failure to the client's answer (core/net/errors.*):
// every ErrorKind's status, the OpenAI error body, what is relayed as the
// engine said it and what is hidden from clients.
#include "core/net/errors.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace pdgate {
namespace {

using nlohmann::json;

GatewayError of(ErrorKind k) {
  GatewayError e;
  e.kind = k;
  e.message = "m";
  return e;
}

// Every kind maps to the status documented beside it, and to the OpenAI
// error type of that status.
TEST(ErrorStatus, EveryKindHasItsStatusAndType) {
  struct Row {
    ErrorKind kind;
    unsigned status;
    const char* type;
  };
  const Row rows[] = {
      {ErrorKind::bad_request, 400, "BadRequestError"},
      {ErrorKind::unsupported_media_type, 415, "UnsupportedMediaTypeError"},
      {ErrorKind::body_too_large, 413, "RequestTooLargeError"},
      {ErrorKind::header_too_large, 431, "RequestHeaderFieldsTooLargeError"},
      {ErrorKind::forbidden, 403, "PermissionDeniedError"},
      {ErrorKind::not_found, 404, "NotFoundError"},
      {ErrorKind::method_not_allowed, 405, "MethodNotAllowedError"},
      {ErrorKind::conflict, 409, "ConflictError"},
      {ErrorKind::unprocessable, 422, "UnprocessableEntityError"},
      {ErrorKind::not_implemented, 501, "NotImplementedError"},
      {ErrorKind::unauthenticated, 401, "AuthenticationError"},
      {ErrorKind::rate_limited, 429, "RateLimitError"},
      {ErrorKind::limiter_unavailable, 503, "ServiceUnavailableError"},
      {ErrorKind::engine_failed, 502, "BadGatewayError"},
      {ErrorKind::connect_failed, 502, "BadGatewayError"},
      {ErrorKind::connect_timed_out, 502, "BadGatewayError"},
      {ErrorKind::timed_out, 502, "BadGatewayError"},
      {ErrorKind::connection_closed, 502, "BadGatewayError"},
      {ErrorKind::bad_response, 502, "BadGatewayError"},
      {ErrorKind::response_too_large, 502, "BadGatewayError"},
      {ErrorKind::ejected, 502, "BadGatewayError"},
      {ErrorKind::no_instance, 503, "ServiceUnavailableError"},
      {ErrorKind::out_of_resources, 503, "ServiceUnavailableError"},
      {ErrorKind::overloaded, 503, "ServiceUnavailableError"},
      {ErrorKind::misconfigured, 503, "ServiceUnavailableError"},
      {ErrorKind::loop, 508, "LoopDetectedError"},
      {ErrorKind::internal, 500, "InternalServerError"},
      {ErrorKind::client_gone, 499, "BadRequestError"},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(to_string(r.kind));
    const auto e = of(r.kind);
    EXPECT_EQ(status_of(e), r.status);
    EXPECT_STREQ(error_type_for(status_of(e)), r.type);
    if (r.kind == ErrorKind::client_gone)
      continue;  // nothing is sent
    const auto res = make_error_response(e, 11, true);
    EXPECT_EQ(res.result_int(), r.status);
    const auto body = json::parse(res.body());
    EXPECT_EQ(body["error"]["type"], r.type);
    EXPECT_EQ(body["error"]["code"], r.status);
    EXPECT_EQ(body["error"]["message"], "m");
    EXPECT_TRUE(body["error"]["param"].is_null());
    EXPECT_EQ(res[boost::beast::http::field::content_type], "application/json");
  }
}

// A limited request says when to come back (Retry-After, whole seconds);
// an unauthenticated one says which scheme is expected.
TEST(ErrorStatus, RateLimitAndAuthHeaders) {
  auto limited = of(ErrorKind::rate_limited);
  limited.retry_after_seconds = 3;
  EXPECT_EQ(make_error_response(limited, 11, true)[boost::beast::http::field::retry_after], "3");
  const auto unauth = make_error_response(of(ErrorKind::unauthenticated), 11, true);
  EXPECT_EQ(unauth[boost::beast::http::field::www_authenticate], "Bearer");
  EXPECT_EQ(make_error_response(of(ErrorKind::limiter_unavailable), 11,
                                true)[boost::beast::http::field::retry_after],
            "1");
}

// An engine's own 4xx keeps its status; anything else the engine
// "rejected" with is a 400, never a 2xx or 5xx passed off as the client's.
TEST(ErrorStatus, EngineRejectionKeepsTheEnginesClientError) {
  auto e = of(ErrorKind::engine_rejected);
  e.engine_status = 422;
  EXPECT_EQ(status_of(e), 422u);
  e.engine_status = 404;
  EXPECT_EQ(status_of(e), 404u);
  e.engine_status = 200;
  EXPECT_EQ(status_of(e), 400u);
  e.engine_status = 503;
  EXPECT_EQ(status_of(e), 400u);
}

// The engine's 4xx body is relayed verbatim, with its content type: the
// engine's message (prompt too long) is what the client needs.
TEST(ErrorResponse, EngineBodyRelayedAsItIs) {
  auto e = of(ErrorKind::engine_rejected);
  e.engine_status = 400;
  e.passthrough_body = R"({"object":"error","message":"prompt too long"})";
  e.passthrough_content_type = "application/json; charset=utf-8";
  const auto res = make_error_response(e, 11, false);
  EXPECT_EQ(res.result_int(), 400);
  EXPECT_EQ(res.body(), e.passthrough_body);
  EXPECT_EQ(res[boost::beast::http::field::content_type], "application/json; charset=utf-8");
  EXPECT_FALSE(res.keep_alive());
}

// Engine addresses live in `detail`: clients see only `message`, unless
// the operator asked for verbose errors.
TEST(ErrorResponse, DetailOnlyWhenVerbose) {
  auto e = of(ErrorKind::engine_failed);
  e.message = "decode stage failed: the engine answered 500";
  e.detail = "decode stage failed: http://10.0.0.7:8200 answered 500: boom";
  e.param = "messages";
  const auto quiet = json::parse(make_error_response(e, 11, true, false).body());
  EXPECT_EQ(quiet["error"]["message"], e.message);
  EXPECT_EQ(quiet["error"]["param"], "messages");
  const auto verbose = json::parse(make_error_response(e, 11, true, true).body());
  EXPECT_EQ(verbose["error"]["message"], e.detail);
  EXPECT_EQ(client_message(e, false), e.message);
  e.detail.clear();
  EXPECT_EQ(client_message(e, true), e.message);
}

// An error path never throws on bytes it quotes: invalid UTF-8 in a
// message is replaced, and the body is still JSON.
TEST(ErrorResponse, InvalidUtf8IsReplacedNotThrown) {
  std::string body;
  ASSERT_NO_THROW(body = error_json(502, std::string("bad \xff\xfe bytes"), "x\xc3"));
  const auto j = json::parse(body);
  EXPECT_EQ(j["error"]["code"], 502);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("bad"), std::string::npos);
}

// The helpers tag their source: the client's or the gateway's.
TEST(ErrorValues, HelpersTagTheSource) {
  const auto c = client_error(ErrorKind::bad_request, "no model", "model");
  EXPECT_EQ(c.source, ErrorSource::client);
  EXPECT_EQ(c.param, "model");
  EXPECT_FALSE(c.retriable);
  const auto g = gateway_error(ErrorKind::no_instance, "no decode", "all ejected");
  EXPECT_EQ(g.source, ErrorSource::gateway);
  EXPECT_EQ(g.detail, "all ejected");
  EXPECT_EQ(status_of(g), 503u);
  EXPECT_STREQ(to_string(ErrorSource::policy), "policy");
}

// A policy's rejection keeps the status it chose (4xx/5xx only, else 500)
// and is tagged as the policy's; a failed fail-closed policy is 503.
TEST(ErrorValues, PolicyErrors) {
  const auto r = policy_error(429, "unknown tenant");
  EXPECT_EQ(r.source, ErrorSource::policy);
  EXPECT_EQ(r.kind, ErrorKind::policy_rejected);
  EXPECT_EQ(status_of(r), 429u);
  EXPECT_EQ(status_of(policy_error(599, "x")), 599u);
  EXPECT_EQ(status_of(policy_error(200, "x")), 500u);
  EXPECT_EQ(status_of(policy_error(600, "x")), 500u);
  const auto f = policy_error(0, "the policy failed", "budget");
  EXPECT_EQ(f.kind, ErrorKind::policy_failed);
  EXPECT_EQ(status_of(f), 503u);
  const auto res = make_error_response(r, 11, true);
  EXPECT_EQ(res.result_int(), 429);
  EXPECT_EQ(json::parse(res.body())["error"]["type"], "RateLimitError");
}

}  // namespace
}  // namespace pdgate
