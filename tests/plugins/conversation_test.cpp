// The pipeline glue of multi-turn reuse: which conversation a request
// names, and the filter on decode's answer (capture decode's params,
// hide them from the client, leave every other byte alone).
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <nlohmann/json.hpp>

#include "core/conversation.hpp"

namespace pdgate {
namespace {

namespace http = boost::beast::http;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr std::string_view kDecodeParams =
    R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[4,5,6]],)"
    R"("remote_engine_id":"eng-d","remote_request_id":"cmpl-r1-0-abcd1234",)"
    R"("remote_host":"0.0.0.0","remote_port":5600,"tp_size":1})";

SseEvent event_of(const std::string& raw) {
  SseScanner s;
  EXPECT_TRUE(s.feed(raw));
  SseEvent e;
  EXPECT_TRUE(s.next(e));
  return e;
}

std::string chunk(const std::string& extra) {
  return R"(data: {"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1,"model":"m",)"
         R"("choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":"length"}])" +
         extra + "}\n\n";
}

http::request<http::string_body> request_with_header(const std::string& value) {
  http::request<http::string_body> r{http::verb::post, "/v1/chat/completions", 11};
  if (!value.empty())
    r.set("X-Conversation-Id", value);
  return r;
}

// The body's conversation_id wins over the header.
TEST(ConversationKey, BodyFirst) {
  RequestFacts f;
  f.conversation_id = "from-body";
  EXPECT_EQ(conversation_key(request_with_header("from-header"), f), "from-body");
}

// Without a body id, the trimmed X-Conversation-Id header names it.
TEST(ConversationKey, HeaderFallback) {
  RequestFacts f;
  EXPECT_EQ(conversation_key(request_with_header("  h-1 "), f), "h-1");
}

// No id, an empty one or one over the length bound: no conversation.
TEST(ConversationKey, AbsentEmptyOrTooLong) {
  RequestFacts f;
  EXPECT_FALSE(conversation_key(request_with_header(""), f));
  f.conversation_id = "";
  EXPECT_FALSE(conversation_key(request_with_header(""), f));
  f.conversation_id = std::string(kMaxConversationIdBytes + 1, 'x');
  EXPECT_FALSE(conversation_key(request_with_header("h"), f));
  f.conversation_id = std::string(kMaxConversationIdBytes, 'x');
  EXPECT_TRUE(conversation_key(request_with_header(""), f));
}

// A taken entry that is a JSON object is used as is; anything else is not.
TEST(PrefillParamsFromEntry, ValidatesObject) {
  EXPECT_EQ(prefill_kv_params_from_entry(R"({"a":1})"), R"({"a":1})");
  EXPECT_FALSE(prefill_kv_params_from_entry("[1]"));
  EXPECT_FALSE(prefill_kv_params_from_entry("{\"a\":"));
  EXPECT_FALSE(prefill_kv_params_from_entry(""));
}

// Events without the params pass through as the same bytes, not a copy.
TEST(DecodeOutputFilter, UntouchedEventsAreTheSameBytes) {
  DecodeOutputFilter f("10.0.0.9", false);
  for (const std::string& raw :
       {chunk(""), std::string("data: [DONE]\n\n"), std::string(": keepalive\n\n"),
        std::string("data: {\"choices\":[{\"text\":\"kv_transfer\"}]}\n\n")}) {
    SseEvent e = event_of(raw);
    std::string_view out = f.on_event(e);
    EXPECT_EQ(out.data(), e.raw.data()) << raw;
    EXPECT_EQ(out, raw);
  }
  EXPECT_FALSE(f.captured());
}

// The final chunk's params are captured, rewritten for the next prefill
// (decode's host, do_remote_decode), and stripped from the client's event.
TEST(DecodeOutputFilter, CapturesAndStripsFinalChunk) {
  DecodeOutputFilter f("10.0.0.9", false);
  SseEvent e = event_of(chunk(",\"kv_transfer_params\":" + std::string(kDecodeParams)));
  const std::string out(f.on_event(e));
  EXPECT_TRUE(f.take_new_capture());
  EXPECT_FALSE(f.take_new_capture());
  ASSERT_TRUE(f.captured());
  json p = json::parse(*f.captured());
  EXPECT_EQ(p["remote_host"], "10.0.0.9");
  EXPECT_EQ(p["do_remote_decode"], true);
  EXPECT_EQ(p["do_remote_prefill"], false);
  EXPECT_EQ(p["remote_block_ids"], json::parse("[[4,5,6]]"));
  EXPECT_EQ(p["remote_request_id"], "cmpl-r1-0-abcd1234");
  EXPECT_EQ(p["tp_size"], 1);
  EXPECT_EQ(out.find("kv_transfer_params"), std::string::npos);
  ASSERT_EQ(out.rfind("data: ", 0), 0u);
  ASSERT_EQ(out.substr(out.size() - 2), "\n\n");
  json c = json::parse(out.substr(6));
  EXPECT_EQ(c["choices"][0]["delta"]["content"], " tok");
  EXPECT_EQ(c["id"], "chatcmpl-r1");
}

// With include_usage vLLM puts the params on the usage chunk (choices []);
// the usage still reaches the client.
TEST(DecodeOutputFilter, UsageChunkKeepsUsage) {
  DecodeOutputFilter f("d", false);
  SseEvent e = event_of(
      R"(data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"kv_transfer_params":)" +
      std::string(kDecodeParams) + "}\n\n");
  json c = json::parse(std::string(f.on_event(e)).substr(6));
  EXPECT_EQ(c["usage"]["total_tokens"], 5);
  EXPECT_FALSE(c.contains("kv_transfer_params"));
  EXPECT_TRUE(f.captured());
}

// expose=true captures but leaves the event byte-identical.
TEST(DecodeOutputFilter, ExposeKeepsParams) {
  DecodeOutputFilter f("d", true);
  const std::string raw = chunk(",\"kv_transfer_params\":" + std::string(kDecodeParams));
  SseEvent e = event_of(raw);
  EXPECT_EQ(f.on_event(e), raw);
  EXPECT_TRUE(f.captured());
}

// Null params are stripped but nothing is captured (decode kept no blocks).
TEST(DecodeOutputFilter, NullParamsNotCaptured) {
  DecodeOutputFilter f("d", false);
  SseEvent e = event_of(chunk(",\"kv_transfer_params\":null"));
  const std::string out(f.on_event(e));
  EXPECT_EQ(out.find("kv_transfer_params"), std::string::npos);
  EXPECT_FALSE(f.captured());
  EXPECT_FALSE(f.take_new_capture());
}

// The null params every answer without blocks carries (compact, last
// member) are cut out byte-exactly; when the key also appears elsewhere
// (here in the generated text) or is spaced out, the body is parsed and
// only the member goes. Bodies keep everything else byte for byte.
TEST(DecodeOutputFilter, NullParamsStrippedExactly) {
  DecodeOutputFilter f("d", false);
  const std::string head =
      R"({"id":"cmpl-1","choices":[{"index":0,"text":" Paris","finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6})";
  std::string body = head + R"(,"kv_transfer_params":null})";
  f.on_body(body);
  EXPECT_EQ(body, head + "}");

  const std::string tricky_head =
      R"({"id":"c","choices":[{"text":"say \"kv_transfer_params\":null}"}])";
  std::string tricky = tricky_head + R"(,"kv_transfer_params":null})";
  f.on_body(tricky);
  EXPECT_EQ(json::parse(tricky), json::parse(tricky_head + "}"));

  std::string spaced = head + R"(, "kv_transfer_params" : null }  )";
  f.on_body(spaced);
  EXPECT_FALSE(json::parse(spaced).contains("kv_transfer_params"));
  EXPECT_EQ(json::parse(spaced)["choices"][0]["text"], " Paris");

  // A null member followed by real params (duplicate keys): the full parse
  // decides, nothing leaks.
  std::string twice = head + R"(,"kv_transfer_params":)" + std::string(kDecodeParams) +
                      R"(,"kv_transfer_params":null})";
  f.on_body(twice);
  EXPECT_EQ(twice.find("remote_block_ids"), std::string::npos) << twice;

  SseEvent e = event_of(chunk(",\"kv_transfer_params\":null"));
  const std::string out(f.on_event(e));
  EXPECT_EQ(out, chunk(""));
  EXPECT_FALSE(f.captured());

  DecodeOutputFilter exposed("d", true);
  std::string kept = head + R"(,"kv_transfer_params":null})";
  exposed.on_body(kept);
  EXPECT_EQ(kept, head + R"(,"kv_transfer_params":null})");
}

// A non-streaming completion body: params captured and removed, the rest kept.
TEST(DecodeOutputFilter, WholeBody) {
  DecodeOutputFilter f("10.1.1.1", false);
  std::string body =
      R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" Paris","finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6},"kv_transfer_params":)" +
      std::string(kDecodeParams) + "}";
  f.on_body(body);
  json b = json::parse(body);
  EXPECT_FALSE(b.contains("kv_transfer_params"));
  EXPECT_EQ(b["choices"][0]["text"], " Paris");
  ASSERT_TRUE(f.captured());
  EXPECT_EQ(json::parse(*f.captured())["remote_host"], "10.1.1.1");
}

// A body without params is not touched at all; one that is not JSON is
// relayed as it came.
TEST(DecodeOutputFilter, BodyWithoutParamsOrNotJson) {
  DecodeOutputFilter f("d", false);
  std::string body = R"({"id":"x","choices":[]})";
  const std::string before = body;
  f.on_body(body);
  EXPECT_EQ(body, before);
  std::string broken = R"({"kv_transfer_params": {)";
  f.on_body(broken);
  EXPECT_EQ(broken, R"({"kv_transfer_params": {)");
  EXPECT_FALSE(f.captured());
}

// Through a memory store: no key gives the default params without a take;
// a stored entry is used once, then the default again.
TEST(PrefillParamsForTurn, UsesStoredEntryOnce) {
  auto stores = make_conversation_stores({});
  ASSERT_TRUE(stores);
  net::io_context io;
  auto h = (*stores)->make_handle(io.get_executor());
  auto& counters = (*stores)->counters();
  std::vector<std::string> got;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        got.push_back(co_await prefill_kv_params_for_turn(*h, counters, std::nullopt, "r0"));
        co_await remember_turn(*h, "c", R"({"remote_host":"d"})", 60s, "r1");
        got.push_back(co_await prefill_kv_params_for_turn(*h, counters, "c", "r2"));
        got.push_back(co_await prefill_kv_params_for_turn(*h, counters, "c", "r3"));
      },
      net::detached);
  io.run();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], kDefaultPrefillKvParams);
  EXPECT_EQ(got[1], R"({"remote_host":"d"})");
  EXPECT_EQ(got[2], kDefaultPrefillKvParams);
  EXPECT_EQ(counters.hits.load(), 1u);
  EXPECT_EQ(counters.misses.load(), 1u);
  json health = conversation_store_json(**stores);
  EXPECT_EQ(health["kind"], "memory");
  EXPECT_EQ(health["hits"], 1);
  EXPECT_EQ(health["entries"], 0);
}

}  // namespace
}  // namespace pdgate
