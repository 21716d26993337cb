#include "core/pipeline/resumption.hpp"

#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

namespace pdgate {
namespace {

using nlohmann::json;

std::string ev(const std::string& data) {
  return "data: " + data + "\n\n";
}

const std::string kRole = ev(
    R"({"id":"chatcmpl-a","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})");
std::string chat_token(const std::string& id, int created, const std::string& text,
                       const char* finish = "null") {
  return ev(R"({"id":")" + id + R"(","object":"chat.completion.chunk","created":)" +
            std::to_string(created) + R"(,"model":"m","choices":[{"index":0,"delta":{"content":")" +
            text + R"("},"finish_reason":)" + finish + "}]}");
}

// The transcript keeps the envelope of the first event, the text and the
// tokens the client was sent, and whether the answer finished.
TEST(StreamTranscript, ReadsWhatTheClientGot) {
  StreamTranscript t(true);
  const std::string events =
      kRole + chat_token("chatcmpl-a", 7, " the") + chat_token("chatcmpl-a", 7, " quick");
  EXPECT_EQ(t.observe(events), events.size());
  EXPECT_EQ(t.text(), " the quick");
  EXPECT_EQ(t.tokens(), 2u);
  EXPECT_EQ(t.id(), R"("chatcmpl-a")");
  EXPECT_EQ(t.created(), "7");
  EXPECT_EQ(t.model(), R"("m")");
  EXPECT_TRUE(t.resumable());
  EXPECT_FALSE(t.finished());
  t.observe(chat_token("chatcmpl-a", 7, " brown", R"("length")") + "data: [DONE]\n\n");
  EXPECT_TRUE(t.finished());
  EXPECT_TRUE(t.saw_done());
}

// An engine's error event stops what the client is sent before it.
TEST(StreamTranscript, StopsAtAnErrorEvent) {
  StreamTranscript t(false);
  const std::string good =
      ev(R"({"id":"cmpl-a","created":1,"model":"m","choices":[{"index":0,"text":" the"}]})");
  const std::string events =
      good + ev(R"({"error":{"message":"boom","type":"InternalServerError","code":500}})") +
      "data: [DONE]\n\n";
  EXPECT_EQ(t.observe(events), good.size());
  EXPECT_TRUE(t.error_event());
  EXPECT_EQ(t.text(), " the");
}

// What a continuation cannot reproduce makes the stream not resumable.
TEST(StreamTranscript, RefusesWhatCannotBeContinued) {
  StreamTranscript tools(true);
  tools.observe(ev(
      R"({"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]})"));
  EXPECT_FALSE(tools.resumable());
  StreamTranscript two(false);
  two.observe(ev(R"({"id":"x","choices":[{"index":1,"text":"a"}]})"));
  EXPECT_FALSE(two.resumable());
  StreamTranscript big(false);
  const std::string chunk(60000, 'a');
  for (int i = 0; i < 20; ++i)
    big.observe(ev(R"({"id":"x","choices":[{"index":0,"text":")" + chunk + R"("}]})"));
  EXPECT_FALSE(big.resumable());
  EXPECT_TRUE(big.text().empty());
}

// The engine's token ids count the tokens when it returned them.
TEST(StreamTranscript, CountsTokenIds) {
  StreamTranscript t(false);
  t.observe(ev(R"({"id":"x","choices":[{"index":0,"text":" ab","token_ids":[5,6]}]})"));
  EXPECT_EQ(t.tokens(), 2u);
}

std::string continuation(const std::string& body, bool chat, const StreamTranscript& t,
                         std::string& why) {
  auto index = index_json_object(body);
  EXPECT_TRUE(index);
  return continuation_body(body, *index, chat, t, why).value_or("");
}

// Chat: the answer so far becomes the final assistant message, vLLM's
// continuation flags are set, max_tokens shrinks, usage is asked for.
TEST(ContinuationBody, ChatContinuesTheAssistantMessage) {
  StreamTranscript t(true);
  t.observe(kRole + chat_token("c", 1, " the") + chat_token("c", 1, " qu\\\"ick"));
  std::string why;
  const std::string out = continuation(
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"stream":true})",
      true, t, why);
  ASSERT_FALSE(out.empty()) << why;
  const json j = json::parse(out);
  EXPECT_EQ(j["messages"].size(), 2u);
  EXPECT_EQ(j["messages"][1]["role"], "assistant");
  EXPECT_EQ(j["messages"][1]["content"], " the qu\"ick");
  EXPECT_EQ(j["continue_final_message"], true);
  EXPECT_EQ(j["add_generation_prompt"], false);
  EXPECT_EQ(j["max_tokens"], 8);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["stream"], true);
}

// Completions: the prompt is extended; a one-string list is one prompt.
TEST(ContinuationBody, CompletionExtendsThePrompt) {
  StreamTranscript t(false);
  t.observe(ev(R"({"id":"x","choices":[{"index":0,"text":" the"}]})"));
  std::string why;
  json j = json::parse(continuation(
      R"({"prompt":"Say","max_tokens":3,"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":false}})",
      false, t, why));
  EXPECT_EQ(j["prompt"], "Say the");
  EXPECT_EQ(j["max_tokens"], 2);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["stream_options"]["continuous_usage_stats"], false);
  j = json::parse(continuation(R"({"prompt":["Say"],"stream":true})", false, t, why));
  EXPECT_EQ(j["prompt"], "Say the");
  EXPECT_FALSE(j.contains("max_tokens"));
}

// Requests a continuation cannot serve are refused with the reason.
TEST(ContinuationBody, RefusesWhatItCannotContinue) {
  StreamTranscript t(false);
  t.observe(ev(R"({"id":"x","choices":[{"index":0,"text":" the"}]})"));
  for (const char* body :
       {R"({"prompt":"a","n":2})", R"({"prompt":"a","best_of":3})", R"({"prompt":"a","echo":true})",
        R"({"prompt":[1,2,3]})", R"({"prompt":["a","b"]})", R"({"prompt":"a","max_tokens":1})"}) {
    std::string why;
    EXPECT_EQ(continuation(body, false, t, why), "") << body;
    EXPECT_FALSE(why.empty()) << body;
  }
  StreamTranscript c(true);
  std::string why;
  EXPECT_EQ(
      continuation(
          R"({"messages":[{"role":"assistant","content":"x"}],"continue_final_message":true})",
          true, c, why),
      "");
}

// The resumed leg's events take the first leg's envelope; its role chunk
// is dropped; its usage counts the prompt once and both legs' tokens.
TEST(ResumedLeg, RewritesIntoTheFirstLegsStream) {
  StreamTranscript t(true);
  t.observe(kRole + chat_token("chatcmpl-a", 7, " the") + chat_token("chatcmpl-a", 7, " quick"));
  ResumedLeg leg(t, 12, true);
  const std::string out = leg.rewrite(
      ev(R"({"id":"chatcmpl-a-r1","object":"chat.completion.chunk","created":9,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})") +
      chat_token("chatcmpl-a-r1", 9, " brown", R"("length")") +
      ev(R"({"id":"chatcmpl-a-r1","object":"chat.completion.chunk","created":9,"model":"m","choices":[],"usage":{"prompt_tokens":20,"total_tokens":21,"completion_tokens":1}})") +
      "data: [DONE]\n\n");
  StreamTranscript seen(true);
  seen.observe(out);
  EXPECT_EQ(seen.text(), " brown");
  EXPECT_EQ(seen.id(), R"("chatcmpl-a")");
  EXPECT_EQ(seen.created(), "7");
  EXPECT_EQ(out.find("\"role\""), std::string::npos);
  EXPECT_EQ(out.find("chatcmpl-a-r1"), std::string::npos);
  EXPECT_NE(out.find(R"("usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3})"),
            std::string::npos)
      << out;
  ASSERT_TRUE(leg.usage());
  EXPECT_EQ(leg.usage()->completion_tokens, 3u);
  EXPECT_TRUE(out.ends_with("data: [DONE]\n\n"));
}

// Usage the gateway asked for is not the client's: dropped.
TEST(ResumedLeg, DropsUsageTheClientDidNotAskFor) {
  StreamTranscript t(false);
  t.observe(ev(R"({"id":"cmpl-a","created":1,"model":"m","choices":[{"index":0,"text":" the"}]})"));
  ResumedLeg leg(t, std::nullopt, false);
  const std::string out = leg.rewrite(ev(
      R"({"id":"cmpl-b","created":2,"model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}})"));
  EXPECT_EQ(out, "");
  ASSERT_TRUE(leg.usage());
  EXPECT_EQ(leg.usage()->prompt_tokens, 8u);  // this leg's prompt held the emitted token
  EXPECT_EQ(leg.usage()->completion_tokens, 5u);
}

}  // namespace
}  // namespace pdgate
