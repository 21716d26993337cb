// read_facts: what the gateway reads from a completion request.
#include "core/routing/request_facts.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/unit/body_fixtures.hpp"

namespace pdgate {
namespace {

using nlohmann::json;
using test::kChat;
using test::kCompletions;
using test::kPrefillParams;
using test::must_index;
using test::parsed;

// --- read_facts --------------------------------------------------------------

// A completions body yields model, stream, conversation id, include_usage and the prompt size.
TEST(ReadFacts, CompletionsFields) {
  const auto idx = must_index(kCompletions);
  const auto f = read_facts(kCompletions, idx, false);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->model, "meta-llama/Llama-3.1-8B-Instruct");
  EXPECT_TRUE(f->stream);
  EXPECT_FALSE(f->is_chat);
  EXPECT_EQ(f->conversation_id, "conv-1");
  EXPECT_TRUE(f->include_usage);
  EXPECT_EQ(f->prompt_bytes, std::string(R"("Tell me a story \u00e9")").size());
}

// A chat body measures `messages`; missing optional fields take their defaults.
TEST(ReadFacts, ChatDefaults) {
  const std::string body = R"({"messages":[{"role":"user","content":"hi"}]})";
  const auto f = read_facts(body, must_index(body), true);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->model, "");
  EXPECT_FALSE(f->stream);
  EXPECT_TRUE(f->is_chat);
  EXPECT_EQ(f->conversation_id, std::nullopt);
  EXPECT_FALSE(f->include_usage);
  EXPECT_EQ(f->prompt_bytes, std::string(R"([{"role":"user","content":"hi"}])").size());
}

// null values count as absent; a numeric conversation id is kept as its JSON text.
TEST(ReadFacts, NullsAndNumericConversation) {
  const std::string body =
      R"({"model":null,"stream":null,"stream_options":null,"conversation_id":42})";
  const auto f = read_facts(body, must_index(body), false);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_FALSE(f->stream);
  EXPECT_EQ(f->conversation_id, "42");
}

// Escaped keys and duplicate keys follow JSON semantics: decoded names, the last one wins.
TEST(ReadFacts, EscapedAndDuplicateKeys) {
  const std::string body = R"({"str\u0065am":false,"stream":true,"m\u006fdel":"x"})";
  const auto f = read_facts(body, must_index(body), false);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->stream);
  EXPECT_EQ(f->model, "x");
}

// Fields of the wrong type are client errors naming the field.
TEST(ReadFacts, WrongTypesFail) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"model":1})", "model"},
      {R"({"stream":"yes"})", "stream"},
      {R"({"stream_options":[]})", "stream_options"},
      {R"({"stream_options":{"include_usage":"y"}})", "include_usage"},
      {R"({"conversation_id":{"a":1}})", "conversation_id"},
  };
  for (const auto& [body, field] : cases) {
    const auto f = read_facts(body, must_index(body), false);
    ASSERT_FALSE(f.ok()) << body;
    EXPECT_NE(f.error().find(field), std::string::npos) << f.error();
  }
}

// --- Prefill body --------------------------------------------------------------

// --- /v1/responses -------------------------------------------------------------

// A Responses body: `input` is the prompt, max_output_tokens the one limit,
// previous_response_id kept; max_tokens there is not read (vLLM ignores it).
TEST(ReadFacts, ResponsesFields) {
  const std::string body =
      R"({"model":"m","input":[{"role":"user","content":"hi"}],"max_output_tokens":7,)"
      R"("max_tokens":3,"stream":true,"previous_response_id":"resp_1"})";
  const auto f = read_facts(body, must_index(body), GenerationApi::responses);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->max_output_tokens, 7);
  EXPECT_FALSE(f->max_tokens);
  EXPECT_TRUE(f->stream);
  EXPECT_EQ(f->previous_response_id, "resp_1");
  EXPECT_EQ(f->prompt_bytes, std::string(R"([{"role":"user","content":"hi"}])").size());
  EXPECT_EQ(prompt_member(GenerationApi::responses), "input");
}

// What vLLM would refuse, and a background response, are refused.
TEST(ReadFacts, ResponsesRefusals) {
  for (const std::string body :
       {R"({"model":"m"})", R"({"input":3})", R"({"input":null})", R"({"input":{}})",
        R"({"input":"x","max_output_tokens":0})", R"({"input":"x","max_output_tokens":1.5})",
        R"({"input":"x","previous_response_id":5})", R"({"input":"x","background":true})"}) {
    EXPECT_FALSE(read_facts(body, must_index(body), GenerationApi::responses).ok()) << body;
  }
  const std::string ok = R"({"input":"x","background":false})";
  EXPECT_TRUE(read_facts(ok, must_index(ok), GenerationApi::responses).ok());
}

}  // namespace
}  // namespace pdgate
