#include "core/pipeline/resumption.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

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

// Events are read as any JSON parser would: keys written with escapes,
// data split over several lines, duplicate keys (the last wins), an event
// that is not JSON (relayed, nothing learned) and the bound on the text.
TEST(StreamTranscript, ReadsEventsAsJsonParsersDo) {
  StreamTranscript t(true);
  const std::string events =
      kRole +
      ev(R"({"choices":[{"index":0,"delta":{"\u0063ontent":" the","content":" quick"}}]})") +
      "data: {\"choices\":[{\"index\":0,\ndata: \"delta\":{\"content\":\" brown\"}}]}\n\n" +
      ev(R"({"choices":[{"index":0,"delta":{"content":" fox"}}]} trailing)") +
      ev(R"({"choices":[{"index":0,"delta":{"content":"\u00e9\n"}}]})");
  EXPECT_EQ(t.observe(events), events.size());
  EXPECT_EQ(t.text(), " quick brown\xc3\xa9\n");
  EXPECT_EQ(t.tokens(), 3u);
  EXPECT_TRUE(t.resumable());

  StreamTranscript big(false);
  const std::string piece(1u << 16, 'x');
  for (std::size_t n = 0; n < kMaxResumableText / piece.size(); ++n)
    big.observe(ev(R"({"choices":[{"index":0,"text":")" + piece + R"("}]})"));
  EXPECT_TRUE(big.resumable());
  EXPECT_EQ(big.text().size(), kMaxResumableText);
  big.observe(ev(R"({"choices":[{"index":0,"text":"y"}]})"));
  EXPECT_FALSE(big.resumable());
  EXPECT_TRUE(big.text().empty());
}

// Each event's envelope (the members before its choices) is read once
// and skipped while it stays the same, byte for byte: what the transcript
// learns is what a JSON parser (nlohmann here) reads from every event,
// whatever changes from one event to the next.
TEST(StreamTranscript, ReadsWhatAParserReadsWhateverTheEnvelopeDoes) {
  std::mt19937 rng(7);
  const std::vector<std::string> envelopes = {
      R"("id":"chatcmpl-a","object":"chat.completion.chunk","created":7,"model":"m",)",
      R"("id":"chatcmpl-b","created":7,"model":"m",)",
      R"( "id" : "chatcmpl-a" , "created":7,"model":"m", )",
      R"("id":"chatcmpl-a","error":null,"created":7,"model":"m",)",
      "",
  };
  const std::vector<std::string> tails = {"", R"(,"usage":null)",
                                          R"(,"usage":{"prompt_tokens":1},"x":[1,"]"])"};
  for (int round = 0; round < 200; ++round) {
    StreamTranscript t(true);
    std::string expected;
    std::string events;
    for (int i = 0; i < 6; ++i) {
      const std::string& envelope = envelopes[rng() % envelopes.size()];
      std::string content = " w" + std::to_string(rng() % 100);
      if (rng() % 4 == 0)
        content += "\\\"q\\\\";
      const std::string data = "{" + envelope + R"("choices":[{"index":0,"delta":{"content":")" +
                               content + R"("},"finish_reason":null}])" +
                               tails[rng() % tails.size()] + "}";
      const auto j = json::parse(data);
      expected += j["choices"][0]["delta"]["content"].get<std::string>();
      events += ev(data);
    }
    EXPECT_EQ(t.observe(events), events.size());
    EXPECT_EQ(t.text(), expected) << events;
    EXPECT_EQ(t.tokens(), 6u);
    EXPECT_TRUE(t.resumable());
  }
  // The envelope skipped, what follows is still read: a second choice, an
  // event that is not JSON after its envelope.
  StreamTranscript t(true);
  const std::string first = chat_token("chatcmpl-a", 7, " the");
  const std::string broken = ev(
      R"({"id":"chatcmpl-a","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":" x"}} oops)");
  EXPECT_EQ(t.observe(first + broken), first.size() + broken.size());
  EXPECT_EQ(t.text(), " the");
  EXPECT_TRUE(t.resumable());
  t.observe(ev(
      R"({"id":"chatcmpl-a","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":1,"delta":{"content":" y"}}]})"));
  EXPECT_FALSE(t.resumable());
}

// A token event in the shape of the stream's others is read by its text
// alone; one whose middle is not a single string is read whole.
TEST(StreamTranscript, TokenEventsOfOneShapeDifferOnlyInText) {
  StreamTranscript t(true);
  std::string events = kRole;
  for (const char* piece : {" the", " qu\\\"ick", " br\\u00f6wn", ""})
    events += chat_token("chatcmpl-a", 7, piece);
  EXPECT_EQ(t.observe(events), events.size());
  EXPECT_EQ(t.text(), " the qu\"ick br\xc3\xb6wn");
  EXPECT_EQ(t.tokens(), 3u);
  EXPECT_TRUE(t.resumable());
  // Same bytes around it, but the middle holds more members than a text.
  const std::string sneaky = R"(" x","tool_calls":[{"index":0}],"content":" y")";
  t.observe(chat_token("chatcmpl-a", 7, sneaky.substr(1, sneaky.size() - 2)));
  EXPECT_FALSE(t.resumable());
  EXPECT_EQ(t.why_not(), "a tool-call stream");
  StreamTranscript f(true);
  f.observe(kRole + chat_token("chatcmpl-a", 7, " the") +
            chat_token("chatcmpl-a", 7, " end", R"("stop")"));
  EXPECT_TRUE(f.finished());
  EXPECT_EQ(f.text(), " the end");
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

// With token ids in the stream (return_token_ids), the continuation is a
// completion of the prompt's ids and the answer's: for a completion its
// prompt, for a chat a completion request of its own (with the fields the
// two share, the limit less what was emitted, usage asked for).
TEST(ContinuationBody, TokenIdsMakeTheContinuationTokenExact) {
  StreamTranscript c(false);
  c.observe(ev(
      R"({"id":"cmpl-a","created":1,"model":"m","choices":[{"index":0,"text":" the","prompt_token_ids":[11,12],"token_ids":[90]}]})"));
  c.observe(ev(
      R"({"id":"cmpl-a","created":1,"model":"m","choices":[{"index":0,"text":" quick","token_ids":[91]}]})"));
  ASSERT_TRUE(c.token_exact());
  EXPECT_EQ(c.prompt_ids(), "11,12");
  EXPECT_EQ(c.ids(), "90,91");
  std::string why;
  const json comp = json::parse(continuation(
      R"({"model":"m","prompt":"hi","max_tokens":10,"stream":true,"return_token_ids":true})", false,
      c, why));
  EXPECT_EQ(comp["prompt"], json::parse("[11,12,90,91]"));
  EXPECT_EQ(comp["max_tokens"], 8);

  StreamTranscript t(true);
  t.observe(ev(
      R"({"id":"chatcmpl-a","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"prompt_token_ids":[5,6,7]})"));
  t.observe(ev(
      R"({"id":"chatcmpl-a","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" the"},"token_ids":[90]}]})"));
  ASSERT_TRUE(t.token_exact());
  const std::string chat_body =
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":5,"temperature":0,"tools":null,"stream":true,"return_token_ids":true,"chat_template_kwargs":{"x":1}})";
  auto index = index_json_object(chat_body);
  ASSERT_TRUE(index);
  bool completion_leg = false;
  const auto leg = continuation_body(chat_body, *index, true, t, why, &completion_leg);
  ASSERT_TRUE(leg) << why;
  EXPECT_TRUE(completion_leg);
  EXPECT_EQ(json::parse(*leg),
            json::parse(R"({"model":"m","temperature":0,"return_token_ids":true,"stream":true,
                            "stream_options":{"include_usage":true},"prompt":[5,6,7,90],
                            "max_tokens":4})"));
  // Without a limit (a completion's default is not a chat's), or with chat
  // logprobs, a chat stream goes on from its text.
  for (
      const std::string body :
      {R"({"messages":[{"role":"user","content":"hi"}],"stream":true})",
       R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"logprobs":true,"stream":true})"}) {
    auto i = index_json_object(body);
    const auto text_leg = continuation_body(body, *i, true, t, why, &completion_leg);
    ASSERT_TRUE(text_leg) << why;
    EXPECT_FALSE(completion_leg) << body;
    EXPECT_NE(text_leg->find("continue_final_message"), std::string::npos) << *text_leg;
  }
  // A token that came without its id, or an id that is not one, and the
  // ids no longer say the answer: text again.
  StreamTranscript gap(false);
  gap.observe(
      ev(R"({"choices":[{"index":0,"text":" a","prompt_token_ids":[1],"token_ids":[90]}]})"));
  gap.observe(ev(R"({"choices":[{"index":0,"text":" b"}]})"));
  EXPECT_FALSE(gap.token_exact());
  StreamTranscript bad(false);
  bad.observe(
      ev(R"({"choices":[{"index":0,"text":" a","prompt_token_ids":[1],"token_ids":[-3]}]})"));
  EXPECT_FALSE(bad.token_exact());
  EXPECT_TRUE(bad.resumable());
}

// Ids the gateway asked for are cut from what the client is sent, from
// any place in an event (first, last, between members, at both levels),
// the transcript keeping them; what remains is the event without them.
TEST(StreamTranscript, StripsTheIdsItAskedFor) {
  StreamTranscript t(true);
  std::string events =
      ev(R"({"prompt_token_ids":[5,6],"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})") +
      ev(R"({"id":"c","choices":[{"token_ids":[90],"index":0,"delta":{"content":" the"}}],"prompt_token_ids":null})") +
      ev(R"({"id":"c","choices":[{"index":0,"delta":{"content":" quick"}, "token_ids" : [91] ,"finish_reason":null}]})") +
      ev(R"({"prompt_token_ids":[],"token_ids":[],"choices":[{"token_ids":[92],"prompt_token_ids":[1],"index":0,"delta":{"content":" brown"}}]})") +
      "data: [DONE]\n\n";
  const std::size_t kept = t.observe(events, true);
  EXPECT_EQ(kept, events.size());
  EXPECT_EQ(
      events,
      ev(R"({"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})") +
          ev(R"({"id":"c","choices":[{"index":0,"delta":{"content":" the"}}]})") +
          ev(R"({"id":"c","choices":[{"index":0,"delta":{"content":" quick"} ,"finish_reason":null}]})") +
          ev(R"({"choices":[{"index":0,"delta":{"content":" brown"}}]})") + "data: [DONE]\n\n");
  EXPECT_EQ(t.text(), " the quick brown");
  EXPECT_TRUE(t.token_exact());
  EXPECT_EQ(t.prompt_ids(), "5,6");
  EXPECT_EQ(t.ids(), "90,91,92");
  // Before an error event: what precedes it, cut; the rest is not the
  // client's.
  StreamTranscript e(false);
  std::string with_error = ev(R"({"choices":[{"index":0,"text":" a","token_ids":[90]}]})") +
                           ev(R"({"error":{"message":"boom"}})");
  const std::size_t before_error = e.observe(with_error, true);
  EXPECT_TRUE(e.error_event());
  EXPECT_EQ(with_error.substr(0, before_error), ev(R"({"choices":[{"index":0,"text":" a"}]})"));
}

// A completion leg continuing a chat stream: its events in chat chunks'
// form, without its prompt's ids (the client had the first leg's).
TEST(ResumedLeg, GivesACompletionLegTheChatForm) {
  StreamTranscript t(true);
  t.observe(kRole + chat_token("chatcmpl-a", 7, " the"));
  ResumedLeg leg(t, 12, true, true);
  const std::string out = leg.rewrite(
      ev(R"({"id":"cmpl-x-r1","object":"text_completion","created":9,"model":"m","choices":[{"index":0,"text":" quick","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[1,2],"token_ids":[91]}],"usage":null})") +
      ev(R"({"id":"cmpl-x-r1","object":"text_completion","created":9,"model":"m","choices":[{"index":0,"text":" brown","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[92]}],"usage":null})") +
      "data: [DONE]\n\n");
  EXPECT_EQ(out.find("prompt_token_ids"), std::string::npos) << out;
  EXPECT_EQ(out.find("text_completion"), std::string::npos) << out;
  EXPECT_EQ(out.find("\"usage\""), std::string::npos) << out;
  StreamTranscript seen(true);
  seen.observe(out);
  EXPECT_EQ(seen.text(), " quick brown");
  EXPECT_TRUE(seen.finished());
  EXPECT_NE(
      out.find(
          R"("delta":{"content":" quick"},"logprobs":null,"finish_reason":null,"token_ids":[91])"),
      std::string::npos)
      << out;
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
