// The pipeline glue of multi-turn reuse: which conversation a request
// names, and the filter on decode's answer (capture decode's params,
// hide them from the client, leave every other byte alone).
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <nlohmann/json.hpp>

#include "core/routing/conversation.hpp"
#include "plugins/conversation_stores.hpp"

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

http::request<http::string_body> request_with(
    std::vector<std::pair<std::string, std::string>> headers) {
  http::request<http::string_body> r{http::verb::post, "/v1/chat/completions", 11};
  for (const auto& [k, v] : headers)
    r.set(k, v);
  return r;
}

ClientIdentity anonymous_off(std::string_view header = "") {
  return {"", header, false};
}

// Without keys or a scope header the scope is the Authorization the client
// sent; none at all is the anonymous scope, or none when that is off.
TEST(ConversationScope, ClientsAuthorizationByDefault) {
  const auto a = conversation_scope(request_with({{"Authorization", "Bearer a"}}), {});
  ASSERT_TRUE(a);
  EXPECT_NE(a, conversation_scope(request_with({{"Authorization", "Bearer b"}}), {}));
  const auto anonymous = conversation_scope(request_with({}), {});
  ASSERT_TRUE(anonymous);
  EXPECT_NE(anonymous, a);
  EXPECT_EQ(anonymous, conversation_scope(request_with({{"Authorization", "  "}}), {}));
  EXPECT_FALSE(conversation_scope(request_with({}), anonymous_off()));
  // A tenant header means nothing unless configured.
  EXPECT_EQ(
      conversation_scope(request_with({{"Authorization", "Bearer a"}, {"X-Tenant-Id", "t"}}), {}),
      a);
}

// With a scope header the header decides: the credential is ignored, an
// absent or blank header is anonymous, and a header value equal to a
// credential never gives the credential's scope.
TEST(ConversationScope, ConfiguredHeader) {
  const ClientIdentity tenant{"", "x-tenant-id", true};
  const auto t1 = conversation_scope(
      request_with({{"X-Tenant-Id", " t1 "}, {"Authorization", "Bearer a"}}), tenant);
  ASSERT_TRUE(t1);
  EXPECT_EQ(conversation_scope(request_with({{"x-tenant-id", "t1"}, {"Authorization", "Bearer b"}}),
                               tenant),
            t1);
  EXPECT_NE(conversation_scope(request_with({{"X-Tenant-Id", "t2"}}), tenant), t1);
  EXPECT_EQ(conversation_scope(request_with({{"Authorization", "Bearer a"}}), tenant),
            conversation_scope(request_with({}), {}));
  EXPECT_FALSE(conversation_scope(request_with({{"Authorization", "Bearer a"}}),
                                  anonymous_off("x-tenant-id")));
  EXPECT_FALSE(
      conversation_scope(request_with({{"X-Tenant-Id", "  "}}), anonymous_off("x-tenant-id")));
  EXPECT_NE(conversation_scope(request_with({{"X-Tenant-Id", "Bearer a"}}), tenant),
            conversation_scope(request_with({{"Authorization", "Bearer a"}}), {}));
}

// With API keys the key decides, whatever the request's Authorization
// text; a configured header narrows it within the key, never across keys.
TEST(ConversationScope, ApiKeyDecides) {
  const auto a =
      conversation_scope(request_with({{"Authorization", "Bearer x"}}), {"team-a", "", true});
  ASSERT_TRUE(a);
  EXPECT_EQ(
      a, conversation_scope(request_with({{"Authorization", "Bearer y"}}), {"team-a", "", true}));
  EXPECT_NE(
      a, conversation_scope(request_with({{"Authorization", "Bearer x"}}), {"team-b", "", true}));
  EXPECT_NE(a, conversation_scope(request_with({{"Authorization", "team-a"}}), {}));
  const ClientIdentity a_header{"team-a", "x-tenant-id", true};
  const ClientIdentity b_header{"team-b", "x-tenant-id", true};
  const auto a_t1 = conversation_scope(request_with({{"X-Tenant-Id", "t1"}}), a_header);
  EXPECT_NE(a_t1, a);
  EXPECT_NE(a_t1, conversation_scope(request_with({{"X-Tenant-Id", "t1"}}), b_header));
  EXPECT_EQ(conversation_scope(request_with({}), a_header), a);
  // Parts are length-prefixed: a name cannot borrow its neighbour's text.
  EXPECT_NE(
      conversation_scope(request_with({{"X-Tenant-Id", "1"}}), {"a", "x-tenant-id", true}),
      conversation_scope(request_with({{"X-Tenant-Id", ""}}), {std::string_view("a\0x-tenant-id\0"
                                                                                "1:1",
                                                                                17),
                                                               "", true}));
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

// A Responses API event carries decode's params in its `response`
// object: they are taken out there, the event keeping its name; other
// named events pass as the same bytes.
TEST(DecodeOutputFilter, ResponsesEventKeepsItsNameAndLosesParams) {
  DecodeOutputFilter f("d", false);
  const std::string raw =
      "event: response.completed\r\ndata: {\"response\":{\"id\":\"resp_1\",\"usage\":"
      "{\"input_tokens\":3},\"kv_transfer_params\":" +
      std::string(kDecodeParams) + "},\"type\":\"response.completed\"}\n\n";
  const std::string out(f.on_event(event_of(raw)));
  EXPECT_EQ(out,
            "event: response.completed\ndata: {\"response\":{\"id\":\"resp_1\",\"usage\":"
            "{\"input_tokens\":3}},\"type\":\"response.completed\"}\n\n");
  const std::string delta =
      "event: response.output_text.delta\ndata: {\"delta\":\"kv_transfer_params\"}\n\n";
  EXPECT_EQ(f.on_event(event_of(delta)), delta);
  DecodeOutputFilter shown("d", true);
  EXPECT_EQ(shown.on_event(event_of(raw)), raw);
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

std::string chat_body(const json& messages) {
  return json{{"model", "m"}, {"messages", messages}}.dump();
}

// One turn through prefill_kv_params_for_turn and, when decode answered
// `answer` with params, remember_turn: what a relayed request does.
struct TurnDriver {
  ConversationStore& store;
  ConversationCounters& counters;

  net::awaitable<std::string> turn(std::optional<std::string> scope, const std::string& body,
                                   const std::string& answer, const std::string& params) {
    const auto index = index_json_object(body);
    EXPECT_TRUE(index);
    const TurnRequest req{std::string("conv"), std::move(scope), body, &*index, true};
    OptionalTurn t;
    std::string got = co_await prefill_kv_params_for_turn(store, counters, req, t, "r");
    if (t) {
      DecodeOutputFilter f("d", false, &t->recorder);
      std::string whole = json{
          {"choices", {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", answer}}}}}},
          {"kv_transfer_params",
           json::parse(
               params)}}.dump();
      f.on_body(whole);
      if (f.take_new_capture())
        co_await remember_turn(store, *t, *f.captured(), 60s, "r");
    }
    co_return got;
  }
};

// Through a memory store: a turn that continues the stored turn's history
// gets its params once; another history misses and uses the entry up; no
// scope misses without touching the store; each miss counted by reason.
TEST(PrefillParamsForTurn, ScopedHistoryChecked) {
  auto stores = make_conversation_stores({});
  ASSERT_TRUE(stores);
  net::io_context io;
  auto h = (*stores)->make_handle(io.get_executor());
  auto& counters = (*stores)->counters();
  TurnDriver d{*h, counters};
  const json m1 = json::array({{{"role", "user"}, {"content", "Hi"}}});
  json m2 = m1;
  m2.push_back({{"role", "assistant"}, {"content", "Hello."}});
  m2.push_back({{"role", "user"}, {"content", "More"}});
  const std::string p1 = R"({"remote_request_id":"one","remote_host":"x"})";
  const std::string p2 = R"({"remote_request_id":"two","remote_host":"x"})";
  std::vector<std::string> got;
  std::vector<std::size_t> entries;
  const auto a = conversation_scope(request_with({{"Authorization", "Bearer a"}}), {});
  const auto b = conversation_scope(request_with({{"Authorization", "Bearer b"}}), {});
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        got.push_back(co_await d.turn(a, chat_body(m1), "Hello.", p1));        // none
        got.push_back(co_await d.turn(std::nullopt, chat_body(m2), "x", p2));  // scope
        entries.push_back((*stores)->health().entries.value_or(99));
        got.push_back(co_await d.turn(b, chat_body(m2), "x", p2));  // none (B's own scope)
        entries.push_back((*stores)->health().entries.value_or(99));
        got.push_back(co_await d.turn(a, chat_body(m2), "Fine.", p2));  // hit
        got.push_back(co_await d.turn(a, chat_body(m2), "Fine.", p2));  // history: m2 again
      },
      net::detached);
  io.run();
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(json::parse(got[0]), json::parse(kDefaultPrefillKvParams));
  EXPECT_EQ(json::parse(got[1]), json::parse(kDefaultPrefillKvParams));
  EXPECT_EQ(json::parse(got[2]), json::parse(kDefaultPrefillKvParams));
  EXPECT_EQ(json::parse(got[3])["remote_request_id"], "one");
  EXPECT_EQ(json::parse(got[4]), json::parse(kDefaultPrefillKvParams));
  EXPECT_EQ(entries, (std::vector<std::size_t>{1, 2}));  // no scope: nothing stored
  EXPECT_EQ(counters.hits.load(), 1u);
  EXPECT_EQ(counters.misses_none.load(), 2u);
  EXPECT_EQ(counters.misses_scope.load(), 1u);
  EXPECT_EQ(counters.misses_history.load(), 1u);
  json health = conversation_store_json(**stores);
  EXPECT_EQ(health["kind"], "memory");
  EXPECT_EQ(health["hits"], 1);
  EXPECT_EQ(health["misses"], 4);
  EXPECT_EQ(health["misses_by_reason"], json::parse(R"({"none":2,"history":1,"scope":1})"));
}

// An entry a previous version stored (bare params) is a history miss and
// is not used; a value that is not JSON is an error.
TEST(PrefillParamsForTurn, OldOrBrokenEntriesNotUsed) {
  auto stores = make_conversation_stores({});
  ASSERT_TRUE(stores);
  net::io_context io;
  auto h = (*stores)->make_handle(io.get_executor());
  auto& counters = (*stores)->counters();
  const auto scope = conversation_scope(request_with({{"Authorization", "Bearer a"}}), {});
  ASSERT_TRUE(scope);
  const auto key = conversation_store_key(*scope, "conv");
  ASSERT_TRUE(key);
  const std::string body = chat_body(json::array({{{"role", "user"}, {"content", "Hi"}}}));
  const auto index = index_json_object(body);
  ASSERT_TRUE(index);
  std::vector<std::string> got;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        const TurnRequest req{std::string("conv"), scope, body, &*index, true};
        OptionalTurn t;
        co_await h->put(*key, R"({"remote_host":"old"})", 60s);
        got.push_back(co_await prefill_kv_params_for_turn(*h, counters, req, t, "r1"));
        co_await h->put(*key, "not json", 60s);
        got.push_back(co_await prefill_kv_params_for_turn(*h, counters, req, t, "r2"));
      },
      net::detached);
  io.run();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], kDefaultPrefillKvParams);
  EXPECT_EQ(got[1], kDefaultPrefillKvParams);
  EXPECT_EQ(counters.misses_history.load(), 1u);
  EXPECT_EQ(counters.errors.load(), 1u);
  EXPECT_EQ(counters.hits.load(), 0u);
}

}  // namespace
}  // namespace pdgate
