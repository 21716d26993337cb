// The pure half of conversation scoping (core/routing/turn_history.hpp): store
// keys, the stored entry's format, the fingerprint of a turn (history plus
// decode's answer, streamed or whole) and the check that a new request
// continues it exactly.
#include "core/routing/turn_history.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace pdgate {
namespace {

using json = nlohmann::json;

constexpr std::string_view kParams = R"({"remote_host":"10.0.0.2","remote_block_ids":[1,2]})";

json user(const std::string& text) {
  return {{"role", "user"}, {"content", text}};
}

json chat_body(const json& messages) {
  return {{"model", "m"}, {"messages", messages}, {"max_tokens", 8}};
}

// A non-streaming chat answer as vLLM writes it.
std::string chat_answer(const std::string& content) {
  return json{{"id", "chatcmpl-1"},
              {"choices",
               {{{"index", 0},
                 {"message",
                  {{"role", "assistant"},
                   {"reasoning_content", nullptr},
                   {"content", content},
                   {"tool_calls", json::array()}}},
                 {"finish_reason", "stop"}}}}}
      .dump();
}

// The same answer as stream chunks: the role chunk, one chunk per piece,
// the usage chunk and [DONE].
std::vector<std::string> chat_chunks(const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  out.push_back(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})");
  for (const auto& p : pieces) {
    out.push_back(json{{"choices", {{{"index", 0}, {"delta", {{"content", p}}}}}}}.dump());
  }
  out.push_back(R"({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}})");
  out.push_back("[DONE]");
  return out;
}

HistoryReading read(const std::string& body, bool is_chat, const StoredTurn* previous) {
  const auto index = index_json_object(body);
  EXPECT_TRUE(index) << body;
  return read_history(body, *index, is_chat, previous);
}

// Turn one of a chat: the entry stored after decode answered `answer`
// (whole body) to `messages`.
StoredTurn chat_turn(const json& messages, const std::string& answer) {
  HistoryReading r = read(chat_body(messages).dump(), true, nullptr);
  EXPECT_TRUE(r.own);
  r.own->on_body(chat_answer(answer));
  auto e = r.own->entry(std::string(kParams));
  EXPECT_TRUE(e);
  return *e;
}

bool continues(const json& body, const StoredTurn& previous, bool is_chat = true) {
  return read(body.dump(), is_chat, &previous).continues;
}

json next(json messages, const json& assistant, const std::string& question) {
  messages.push_back(assistant);
  messages.push_back(user(question));
  return messages;
}

json assistant(const std::string& content) {
  return {{"role", "assistant"}, {"content", content}};
}

// The key is 64 hex digits, the same for the same pair, different when the
// scope or the id differ, and names neither; moving bytes between the
// scope and the id changes it.
TEST(ConversationStoreKey, ScopedAndOpaque) {
  using namespace std::string_literals;
  const std::string a = "authorization\0Bearer a"s;
  const auto k = conversation_store_key(a, "conv-1");
  ASSERT_TRUE(k);
  EXPECT_EQ(k->size(), 64u);
  EXPECT_EQ(k->find("conv"), std::string::npos);
  EXPECT_EQ(conversation_store_key(a, "conv-1"), k);
  EXPECT_NE(conversation_store_key("authorization\0Bearer b"s, "conv-1"), k);
  EXPECT_NE(conversation_store_key(a, "conv-2"), k);
  EXPECT_NE(conversation_store_key("ab", "c"), conversation_store_key("a", "bc"));
}

// The stored entry round-trips; a previous version's bare params, another
// version, a malformed fingerprint or extent are not entries.
TEST(StoredTurn, EncodeDecode) {
  StoredTurn t{TurnKind::completion, 1234, std::string(64, 'a'), std::string(kParams)};
  const std::string v = encode_stored_turn(t);
  EXPECT_TRUE(json::accept(v)) << v;
  const auto back = decode_stored_turn(v);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->kind, TurnKind::completion);
  EXPECT_EQ(back->extent, 1234u);
  EXPECT_EQ(back->fingerprint, t.fingerprint);
  EXPECT_EQ(back->params, kParams);

  EXPECT_FALSE(decode_stored_turn(kParams));
  EXPECT_FALSE(decode_stored_turn(R"({"v":3,"kind":"chat","n":1,"fp":")" + std::string(64, 'a') +
                                  R"(","params":{}})"));
  EXPECT_FALSE(decode_stored_turn(R"({"v":2,"kind":"chat","n":1,"fp":"abc","params":{}})"));
  EXPECT_FALSE(decode_stored_turn(R"({"v":2,"kind":"chat","n":-1,"fp":")" + std::string(64, 'a') +
                                  R"(","params":{}})"));
  EXPECT_FALSE(decode_stored_turn(R"({"v":2,"kind":"chat","n":1,"fp":")" + std::string(64, 'a') +
                                  R"(","params":[1]})"));
  EXPECT_FALSE(decode_stored_turn("not json"));
}

// The next turn continues: earlier messages as sent, then the assistant
// message carrying decode's answer (its JSON escaping may differ, and
// members that carry nothing are allowed), then anything.
TEST(TurnHistory, ChatContinuation) {
  const json m1 = json::array({{{"role", "system"}, {"content", "Be brief."}}, user("Hi é?")});
  const StoredTurn t = chat_turn(m1, "Hello é \"x\"");
  EXPECT_EQ(t.kind, TurnKind::chat);
  EXPECT_EQ(t.extent, 2u);
  EXPECT_EQ(t.params, kParams);
  EXPECT_TRUE(continues(chat_body(next(m1, assistant("Hello é \"x\""), "More?")), t));
  // The answer resent with \u escapes: the same decoded content.
  const std::string escaped = R"({"model":"m","messages":[)" + m1[0].dump() + "," + m1[1].dump() +
                              R"(,{"role":"assistant","content":"Hello \u00e9 \"x\""},)"
                              R"({"role":"user","content":"More?"}]})";
  EXPECT_TRUE(read(escaped, true, &t).continues);
  // The OpenAI SDK's echo of a message object: empty members are fine.
  json sdk = assistant("Hello é \"x\"");
  sdk["tool_calls"] = nullptr;
  sdk["refusal"] = nullptr;
  sdk["annotations"] = json::array();
  EXPECT_TRUE(continues(chat_body(next(m1, sdk, "More?")), t));
  // Nothing after the answer is still a continuation.
  json only = m1;
  only.push_back(assistant("Hello é \"x\""));
  EXPECT_TRUE(continues(chat_body(only), t));
  // Other request members (sampling, stream, the conversation id) do not matter.
  json body = chat_body(next(m1, assistant("Hello é \"x\""), "More?"));
  body["temperature"] = 0.3;
  body["conversation_id"] = "c";
  EXPECT_TRUE(continues(body, t));
}

// Every way a request can fail to continue the stored turn.
TEST(TurnHistory, ChatMismatches) {
  const json m1 = json::array({{{"role", "system"}, {"content", "Be brief."}}, user("Hi?")});
  const StoredTurn t = chat_turn(m1, "Hello.");
  json edited = m1;
  edited[0]["content"] = "Be verbose.";
  EXPECT_FALSE(continues(chat_body(next(edited, assistant("Hello."), "More?")), t)) << "edit";
  EXPECT_FALSE(continues(chat_body(m1), t)) << "regenerate";
  EXPECT_FALSE(continues(chat_body(next(m1, assistant("Hello!"), "More?")), t)) << "answer";
  EXPECT_FALSE(continues(chat_body(next(m1, assistant("Hello"), "More?")), t)) << "truncated";
  EXPECT_FALSE(continues(chat_body(next(m1, user("Hello."), "More?")), t)) << "role";
  json named = assistant("Hello.");
  named["name"] = "bot";
  EXPECT_FALSE(continues(chat_body(next(m1, named, "More?")), t)) << "extra member";
  json parts = {{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "Hello."}}}}};
  EXPECT_FALSE(continues(chat_body(next(m1, parts, "More?")), t)) << "content parts";
  json dropped = json::array({m1[1], assistant("Hello."), user("More?")});
  EXPECT_FALSE(continues(chat_body(dropped), t)) << "first message dropped";
  // The earlier messages are compared as the client sent them: the same
  // message with other spacing is another text.
  std::string spaced = chat_body(next(m1, assistant("Hello."), "More?")).dump();
  spaced.replace(spaced.find(R"("role":"system")"), 15, R"("role": "system")");
  EXPECT_FALSE(read(spaced, true, &t).continues) << "spacing";
  json other_model = chat_body(next(m1, assistant("Hello."), "More?"));
  other_model["model"] = "other";
  EXPECT_FALSE(continues(other_model, t)) << "model";
  json tools = chat_body(next(m1, assistant("Hello."), "More?"));
  tools["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_FALSE(continues(tools, t)) << "tools";
  // A completions entry never matches a chat request, nor the reverse.
  StoredTurn as_completion = t;
  as_completion.kind = TurnKind::completion;
  EXPECT_FALSE(continues(chat_body(next(m1, assistant("Hello."), "More?")), as_completion));
}

// Streaming and whole answers give the same fingerprint; the answer is the
// first choice's content, in order.
TEST(TurnRecorder, StreamEqualsBody) {
  const json m1 = json::array({user("Count.")});
  const StoredTurn whole = chat_turn(m1, " one two");
  HistoryReading r = read(chat_body(m1).dump(), true, nullptr);
  ASSERT_TRUE(r.own);
  for (const auto& c : chat_chunks({" one", " two"}))
    r.own->on_chunk(c);
  const auto streamed = r.own->entry(std::string(kParams));
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->fingerprint, whole.fingerprint);
  EXPECT_EQ(r.own->answer_bytes(), 8u);

  HistoryReading swapped = read(chat_body(m1).dump(), true, nullptr);
  for (const auto& c : chat_chunks({" two", " one"}))
    swapped.own->on_chunk(c);
  EXPECT_NE(swapped.own->entry(std::string(kParams))->fingerprint, whole.fingerprint);
}

// Answers a client cannot resend as plain assistant text are not stored:
// several choices, tool calls, reasoning, an error, too much text.
TEST(TurnRecorder, UnreproducibleAnswersStoreNothing) {
  const std::string body = chat_body(json::array({user("Q")})).dump();
  auto fresh = [&] { return std::move(*read(body, true, nullptr).own); };
  {
    TurnRecorder r = fresh();
    r.on_chunk(R"({"choices":[{"index":1,"delta":{"content":"b"}}]})");
    EXPECT_FALSE(r.entry(std::string(kParams)));
  }
  {
    TurnRecorder r = fresh();
    r.on_chunk(R"({"choices":[{"index":0,"delta":{"tool_calls":[{"id":"x"}]}}]})");
    EXPECT_FALSE(r.entry(std::string(kParams)));
  }
  {
    TurnRecorder r = fresh();
    r.on_chunk(R"({"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]})");
    EXPECT_FALSE(r.entry(std::string(kParams)));
  }
  {
    TurnRecorder r = fresh();
    r.on_chunk(R"({"error":{"message":"boom","code":500}})");
    EXPECT_FALSE(r.entry(std::string(kParams)));
  }
  {
    TurnRecorder r = fresh();
    const std::string big(kMaxFingerprintedAnswerBytes / 2 + 1, 'x');
    r.on_chunk(json{{"choices", {{{"index", 0}, {"delta", {{"content", big}}}}}}}.dump());
    EXPECT_TRUE(r.entry(std::string(kParams)));
    r.on_chunk(json{{"choices", {{{"index", 0}, {"delta", {{"content", big}}}}}}}.dump());
    EXPECT_FALSE(r.entry(std::string(kParams)));
  }
  {
    TurnRecorder r = fresh();
    r.on_body(R"({"choices":[{"index":0,"message":{"role":"assistant","content":"a"}},)"
              R"({"index":1,"message":{"role":"assistant","content":"b"}}]})");
    EXPECT_FALSE(r.entry(std::string(kParams)));
  }
  // Null and empty members, and [DONE], are fine.
  TurnRecorder ok = fresh();
  ok.on_chunk(R"({"choices":[{"index":0,"delta":{"content":null,"tool_calls":[]}}]})");
  ok.on_chunk("[DONE]");
  EXPECT_TRUE(ok.entry(std::string(kParams)));
}

// Completions: the next prompt must begin with prompt + generated text;
// echo and prompts that are not one string are never fingerprinted.
TEST(TurnHistory, CompletionContinuation) {
  const json b1 = {{"model", "m"}, {"prompt", "Once upon"}, {"max_tokens", 4}};
  HistoryReading r = read(b1.dump(), false, nullptr);
  ASSERT_TRUE(r.own);
  r.own->on_chunk(R"({"choices":[{"index":0,"text":" a"}]})");
  r.own->on_chunk(R"({"choices":[{"index":0,"text":" time"}]})");
  const auto t = r.own->entry(std::string(kParams));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->kind, TurnKind::completion);
  EXPECT_EQ(t->extent, std::string("Once upon a time").size());

  auto with_prompt = [&](const std::string& p) {
    json b = b1;
    b["prompt"] = p;
    return b;
  };
  EXPECT_TRUE(continues(with_prompt("Once upon a time"), *t, false));
  EXPECT_TRUE(continues(with_prompt("Once upon a time, there"), *t, false));
  EXPECT_FALSE(continues(with_prompt("Once upon a tim"), *t, false));
  EXPECT_FALSE(continues(with_prompt("Once upon a Time, there"), *t, false));
  EXPECT_FALSE(continues(with_prompt("Once upon"), *t, false));
  json other_model = with_prompt("Once upon a time, there");
  other_model["model"] = "other";
  EXPECT_FALSE(continues(other_model, *t, false));
  // The whole body gives the same entry as the stream.
  HistoryReading w = read(b1.dump(), false, nullptr);
  w.own->on_body(R"({"choices":[{"index":0,"text":" a time","finish_reason":"length"}]})");
  EXPECT_EQ(w.own->entry(std::string(kParams))->fingerprint, t->fingerprint);

  json echo = with_prompt("Once upon a time, there");
  echo["echo"] = true;
  const HistoryReading e = read(echo.dump(), false, &*t);
  EXPECT_TRUE(e.continues);  // it may reuse, but its own answer is not stored
  EXPECT_FALSE(e.own);
  EXPECT_TRUE(read(with_prompt("x").dump(), false, nullptr).own);
  json tokens = b1;
  tokens["prompt"] = json::array({1, 2, 3});
  EXPECT_FALSE(read(tokens.dump(), false, &*t).own);
  EXPECT_FALSE(read(tokens.dump(), false, &*t).continues);
}

// The check on a 1 MiB history (200 earlier messages of 4 KiB and a
// 200 KiB answer) is one pass: well under the bound even in a sanitizer
// build. Prints what it measured.
TEST(TurnHistory, OneMebibyteHistoryCost) {
  json m = json::array();
  for (int i = 0; i < 200; ++i)
    m.push_back(user(std::string(4096, static_cast<char>('a' + i % 26))));
  const std::string answer(200 * 1024, 'z');
  const StoredTurn t = chat_turn(m, answer);
  const std::string body = chat_body(next(m, assistant(answer), "next?")).dump();
  ASSERT_GT(body.size(), 1000u * 1024);
  const auto index = index_json_object(body);
  ASSERT_TRUE(index);
  constexpr int kRounds = 20;
  const auto start = std::chrono::steady_clock::now();
  int hits = 0;
  for (int i = 0; i < kRounds; ++i)
    hits += read_history(body, *index, true, &t).continues;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
      kRounds;
  EXPECT_EQ(hits, kRounds);
  // For scale: the validation and indexing every request body gets anyway.
  const auto index_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i)
    ASSERT_TRUE(index_json_object(body));
  const double index_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - index_start)
          .count() /
      kRounds;
  const auto parse_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i)
    ASSERT_FALSE(json::parse(body).is_null());
  const double parse_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - parse_start)
          .count() /
      kRounds;
  std::printf(
      "read_history on a %zu-byte body: %.3f ms (index_json_object: %.3f ms, "
      "nlohmann::json::parse: %.3f ms)\n",
      body.size(), ms, index_ms, parse_ms);
  EXPECT_LT(ms, 50.0);
}

}  // namespace
}  // namespace pdgate
