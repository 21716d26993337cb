// The request hook's pure parts: which upstream headers a policy may edit,
// and the body edits (max_tokens cap, priority).
#include <gtest/gtest.h>

#include "core/routing/request_hook.hpp"

namespace pdgate {
namespace {

std::optional<std::string> edited(std::string_view body, const RequestDecision& d,
                                  bool is_chat = true) {
  auto index = index_json_object(body);
  EXPECT_TRUE(index) << body;
  return hooked_body(body, *index, is_chat, d);
}

// Ordinary names and values pass; hop-by-hop, framing and pdgate's own
// headers, non-token names and control characters are refused.
TEST(HeaderEdit, RefusesWhatPdgateOwns) {
  const std::string v = "gold";
  EXPECT_FALSE(header_edit_error("x-tenant-tier", &v));
  EXPECT_FALSE(header_edit_error("x-tenant-tier"));
  for (const char* name : {"Connection", "transfer-encoding", "Host", "content-length",
                           "X-Request-Id", "authorization", "traceparent", "x-forwarded-for",
                           "X-Pdgate-Anything", "bad name", "", "a:b"}) {
    EXPECT_TRUE(header_edit_error(name, &v)) << name;
  }
  const std::string long_name(kMaxHeaderNameBytes + 1, 'a');
  EXPECT_TRUE(header_edit_error(long_name, &v));
  const std::string crlf = "a\r\nx-injected: 1";
  EXPECT_TRUE(header_edit_error("x-ok", &crlf));
  const std::string big(kMaxHeaderValueBytes + 1, 'v');
  EXPECT_TRUE(header_edit_error("x-ok", &big));
}

// A cap lowers larger limits (both of a chat's fields), keeps smaller
// ones, and becomes max_tokens when the request gave none.
// A policy's refusal may carry Retry-After and x-* headers, bounded.
TEST(RefusalHeader, OnlyRetryAfterAndXHeadersWithinBounds) {
  EXPECT_FALSE(refusal_header_error("Retry-After", "5"));
  EXPECT_FALSE(refusal_header_error("x-quota-left", "0"));
  EXPECT_TRUE(refusal_header_error("Set-Cookie", "a=b"));
  EXPECT_TRUE(refusal_header_error("Location", "http://x"));
  EXPECT_TRUE(refusal_header_error("X-Request-Id", "forged"));
  EXPECT_TRUE(refusal_header_error("x-pdgate-anything", "1"));
  EXPECT_TRUE(refusal_header_error("x-", "1"));
  EXPECT_TRUE(refusal_header_error("x-bad name", "1"));
  EXPECT_TRUE(refusal_header_error("x-a", "line\r\nInjected: 1"));
  EXPECT_TRUE(refusal_header_error("x-a", std::string(kMaxRefusalValueBytes + 1, 'v')));
  EXPECT_TRUE(refusal_header_error("x-" + std::string(kMaxHeaderNameBytes, 'n'), "1"));
}

TEST(HookedBody, CapsMaxTokens) {
  RequestDecision d;
  d.max_tokens_cap = 100;
  EXPECT_EQ(edited(R"({"max_tokens":500,"max_completion_tokens":300,"x":1})", d),
            R"({"max_tokens":100,"max_completion_tokens":100,"x":1})");
  EXPECT_EQ(edited(R"({"max_tokens":50})", d), std::nullopt);
  EXPECT_EQ(edited(R"({"prompt":"p"})", d, false), R"({"prompt":"p","max_tokens":100})");
  EXPECT_EQ(edited(R"({"max_tokens":null})", d), R"({"max_tokens":100})");
  // Completions have no max_completion_tokens: left as sent.
  EXPECT_EQ(edited(R"({"max_tokens":500,"max_completion_tokens":300})", d, false),
            R"({"max_tokens":100,"max_completion_tokens":300})");
  // Written as vLLM reads numbers: integral floats, exponents, digit
  // strings are capped. A value it cannot read (the validate phase
  // refuses those first) is capped all the same, never let through.
  EXPECT_EQ(edited(R"({"max_tokens":500.0})", d), R"({"max_tokens":100})");
  EXPECT_EQ(edited(R"({"max_tokens":"500"})", d), R"({"max_tokens":100})");
  EXPECT_EQ(edited(R"({"max_tokens":1e3})", d), R"({"max_tokens":100})");
  EXPECT_EQ(edited(R"({"max_tokens":50.0})", d), std::nullopt);
  EXPECT_EQ(edited(R"({"max_tokens":"many"})", d), R"({"max_tokens":100})");
}

// Priority is set, replaced, or left alone when already equal; no field
// edit means no new body.
TEST(HookedBody, SetsPriority) {
  RequestDecision d;
  EXPECT_EQ(edited(R"({"a":1})", d), std::nullopt);
  d.priority = -3;
  EXPECT_EQ(edited(R"({"a":1})", d), R"({"a":1,"priority":-3})");
  EXPECT_EQ(edited(R"({"priority":7,"a":1})", d), R"({"priority":-3,"a":1})");
  EXPECT_EQ(edited(R"({"priority":-3})", d), std::nullopt);
}

// Four bytes of prompt JSON per token, rounded up.
TEST(HookedBody, TokenEstimate) {
  EXPECT_EQ(estimated_prompt_tokens(0), 0u);
  EXPECT_EQ(estimated_prompt_tokens(1), 1u);
  EXPECT_EQ(estimated_prompt_tokens(400), 100u);
}

// A Responses request reads max_output_tokens alone: the cap goes there,
// never to a max_tokens vLLM would ignore.
TEST(HookedBody, ResponsesCapMaxOutputTokens) {
  RequestDecision d;
  d.max_tokens_cap = 100;
  const std::string over = R"({"input":"x","max_output_tokens":500})";
  const auto a = hooked_body(over, *index_json_object(over), GenerationApi::responses, d);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, R"({"input":"x","max_output_tokens":100})");
  const std::string none = R"({"input":"x"})";
  const auto b = hooked_body(none, *index_json_object(none), GenerationApi::responses, d);
  ASSERT_TRUE(b);
  EXPECT_NE(b->find(R"("max_output_tokens":100)"), std::string::npos) << *b;
  EXPECT_EQ(b->find("max_tokens"), std::string::npos) << *b;
}

}  // namespace
}  // namespace pdgate
