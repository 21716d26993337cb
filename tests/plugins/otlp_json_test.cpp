#include "plugins/otlp_json.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pdgate {
namespace {

Span sample_span(bool root) {
  Span s;
  s.trace_id =
      parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")->trace_id;
  s.span_id = {1, 2, 3, 4, 5, 6, 7, 8};
  if (!root)
    s.parent_id = {0xa, 0xb, 0xc, 0xd, 0xe, 0xf, 0x10, 0x11};
  s.name = root ? "POST /v1/chat/completions" : "prefill";
  s.kind = root ? SpanKind::server : SpanKind::client;
  s.start_ns = 1700000000123456789ull;
  s.end_ns = 1700000000223456789ull;
  s.attributes.push_back({"url.full", std::string("http://p1:8100")});
  s.attributes.push_back({"http.response.status_code", std::int64_t{200}});
  return s;
}

// The standard resourceSpans/scopeSpans/spans shape, service.name=pdgate,
// hex ids, string-encoded times and integers, parent only when there is one.
TEST(OtlpJson, StandardShape) {
  Span failed = sample_span(false);
  failed.error = true;
  failed.status_message = "prefill stage failed: timed out";
  const auto j = nlohmann::json::parse(otlp_json({sample_span(true), failed}, "pdgate", "1.2.3"));
  const auto& rs = j.at("resourceSpans").at(0);
  EXPECT_EQ(rs.at("resource").at("attributes").at(0).at("key"), "service.name");
  EXPECT_EQ(rs.at("resource").at("attributes").at(0).at("value").at("stringValue"), "pdgate");
  const auto& ss = rs.at("scopeSpans").at(0);
  EXPECT_EQ(ss.at("scope").at("version"), "1.2.3");
  const auto& spans = ss.at("spans");
  ASSERT_EQ(spans.size(), 2u);
  const auto& server = spans.at(0);
  EXPECT_EQ(server.at("traceId"), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(server.at("spanId"), "0102030405060708");
  EXPECT_FALSE(server.contains("parentSpanId"));
  EXPECT_FALSE(server.contains("status"));
  EXPECT_EQ(server.at("kind"), 2);
  EXPECT_EQ(server.at("startTimeUnixNano"), "1700000000123456789");
  EXPECT_EQ(server.at("endTimeUnixNano"), "1700000000223456789");
  EXPECT_EQ(server.at("attributes").at(0).at("value").at("stringValue"), "http://p1:8100");
  EXPECT_EQ(server.at("attributes").at(1).at("value").at("intValue"), "200");
  const auto& client = spans.at(1);
  EXPECT_EQ(client.at("parentSpanId"), "0a0b0c0d0e0f1011");
  EXPECT_EQ(client.at("kind"), 3);
  EXPECT_EQ(client.at("status").at("code"), 2);
  EXPECT_EQ(client.at("status").at("message"), "prefill stage failed: timed out");
}

// Invalid UTF-8 from a client (a span name from its path) is replaced,
// and quotes, backslashes and control characters are escaped: the body
// stays valid JSON and says what was sent.
TEST(OtlpJson, StringsEscaped) {
  Span s = sample_span(true);
  s.name = "POST /v1/\xff\xfe";
  s.attributes.push_back({"pdgate.request_id", std::string("a\"b\\c\nd")});
  const std::string body = otlp_json({s}, "pdgate", "");
  ASSERT_TRUE(nlohmann::json::accept(body)) << body;
  const auto span = nlohmann::json::parse(body)["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  EXPECT_EQ(span["attributes"][2]["value"]["stringValue"], "a\"b\\c\nd");
}

}  // namespace
}  // namespace pdgate
