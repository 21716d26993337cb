#include "core/body_rewrite.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace pdgate {
namespace {

using nlohmann::json;

JsonObjectIndex must_index(std::string_view text) {
  auto r = index_json_object(text);
  EXPECT_TRUE(r.ok()) << r.error() << "\n" << text;
  return r.ok() ? *r : JsonObjectIndex{};
}

// Parses a rendered body after checking our own validator accepts it too.
json parsed(const std::string& text) {
  EXPECT_TRUE(index_json_object(text).ok()) << text;
  return json::parse(text);
}

const std::string kCompletions =
    R"({"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Tell me a story \u00e9",)"
    R"("max_tokens":50,"stream":true,"stream_options":{"include_usage":true},)"
    R"("min_tokens":5,"conversation_id":"conv-1","kv_transfer_params":{"evil":true},)"
    R"("temperature":0.0,"echo":false})";

const std::string kChat =
    R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url",)"
    R"("image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"hi"}]}],)"
    R"("max_completion_tokens":64,"max_tokens":64,"stream":true,"conversation_id":"c"})";

const std::string kPrefillParams =
    R"({"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [[1,2,3]],)"
    R"( "remote_engine_id": "0a1b-uuid", "remote_request_id": "cmpl-x-0-1a2b3c4d",)"
    R"( "remote_host": "10.0.0.5", "remote_port": 5600, "tp_size": 1, "future_field": {"x":[]}})";

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

// The completions prefill body follows every field rule and keeps the prompt byte-identical.
TEST(PrefillBody, CompletionsRules) {
  const auto idx = must_index(kCompletions);
  const std::string out = make_prefill_body(kCompletions, idx);
  const json j = parsed(out);
  EXPECT_EQ(j["stream"], false);
  EXPECT_EQ(j["max_tokens"], 1);
  EXPECT_FALSE(j.contains("max_completion_tokens"));
  EXPECT_FALSE(j.contains("min_tokens"));
  EXPECT_FALSE(j.contains("stream_options"));
  EXPECT_FALSE(j.contains("conversation_id"));
  EXPECT_EQ(j["kv_transfer_params"], json::parse(kDefaultPrefillKvParams));
  EXPECT_EQ(j["model"], "meta-llama/Llama-3.1-8B-Instruct");
  EXPECT_EQ(j["temperature"], 0.0);
  EXPECT_EQ(j["echo"], false);
  EXPECT_NE(out.find(R"("prompt":"Tell me a story \u00e9")"), std::string::npos);
  EXPECT_EQ(j.size(), 7u);
}

// The default params are exactly the protocol's "send to a decode" object.
TEST(PrefillBody, DefaultParamsMatchProtocol) {
  EXPECT_EQ(json::parse(kDefaultPrefillKvParams),
            json::parse(R"({"do_remote_decode": true, "do_remote_prefill": false,
                "remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
                "remote_port": null})"));
}

// A chat body with max_completion_tokens gets it set to 1; media items stay byte-identical.
TEST(PrefillBody, ChatMaxCompletionTokens) {
  const auto idx = must_index(kChat);
  const std::string out = make_prefill_body(kChat, idx);
  const json j = parsed(out);
  EXPECT_EQ(j["max_completion_tokens"], 1);
  EXPECT_EQ(j["max_tokens"], 1);
  EXPECT_EQ(j["stream"], false);
  EXPECT_FALSE(j.contains("conversation_id"));
  const auto messages = raw_member(kChat, idx, "messages");
  ASSERT_TRUE(messages);
  EXPECT_NE(out.find(*messages), std::string::npos);
}

// max_completion_tokens is not added when the client did not send it; missing stream and max_tokens
// are added.
TEST(PrefillBody, AddsOnlyRequiredFields) {
  const std::string body = R"({"messages":[]})";
  const json j = parsed(make_prefill_body(body, must_index(body)));
  EXPECT_FALSE(j.contains("max_completion_tokens"));
  EXPECT_EQ(j["max_tokens"], 1);
  EXPECT_EQ(j["stream"], false);
  EXPECT_TRUE(j.contains("kv_transfer_params"));
}

// Cached multi-turn params replace the defaults and pass through byte-identical.
TEST(PrefillBody, CustomParams) {
  const auto idx = must_index(kCompletions);
  const std::string out = make_prefill_body(kCompletions, idx, kPrefillParams);
  EXPECT_NE(out.find(R"("kv_transfer_params":)" + kPrefillParams), std::string::npos);
  EXPECT_EQ(parsed(out)["kv_transfer_params"], json::parse(kPrefillParams));
}

// --- Decode body ---------------------------------------------------------------

// The decode body keeps the client's own generation fields and gets the prefill's params verbatim.
TEST(DecodeBody, KeepsClientFieldsAndAddsParams) {
  const auto idx = must_index(kCompletions);
  const std::string out = make_decode_body(kCompletions, idx, kPrefillParams);
  const json j = parsed(out);
  EXPECT_EQ(j["max_tokens"], 50);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"], json::parse(R"({"include_usage":true})"));
  EXPECT_EQ(j["min_tokens"], 5);
  EXPECT_FALSE(j.contains("conversation_id"));
  EXPECT_NE(out.find(kPrefillParams), std::string::npos);
  EXPECT_EQ(out.find("evil"), std::string::npos);
}

// Without params (absent or null) the client's own kv_transfer_params are still removed.
TEST(DecodeBody, NoParamsRemovesClientParams) {
  const auto idx = must_index(kCompletions);
  for (const std::optional<std::string_view> p :
       {std::optional<std::string_view>(), std::optional<std::string_view>("null"),
        std::optional<std::string_view>(" null ")}) {
    const json j = parsed(make_decode_body(kCompletions, idx, p));
    EXPECT_FALSE(j.contains("kv_transfer_params"));
    EXPECT_FALSE(j.contains("conversation_id"));
    EXPECT_EQ(j["max_tokens"], 50);
  }
}

// A chat decode body keeps both token limits as the client sent them.
TEST(DecodeBody, ChatKeepsLimits) {
  const auto idx = must_index(kChat);
  const json j = parsed(make_decode_body(kChat, idx, kPrefillParams));
  EXPECT_EQ(j["max_completion_tokens"], 64);
  EXPECT_EQ(j["max_tokens"], 64);
  EXPECT_EQ(j["kv_transfer_params"]["remote_block_ids"], json::parse("[[1,2,3]]"));
}

// The one-hop body only loses conversation_id and kv_transfer_params.
TEST(PassthroughBody, RemovesOnlyGatewayFields) {
  const auto idx = must_index(kCompletions);
  json expected = json::parse(kCompletions);
  expected.erase("conversation_id");
  expected.erase("kv_transfer_params");
  EXPECT_EQ(parsed(make_passthrough_body(kCompletions, idx)), expected);
  const std::string plain = R"({"prompt":"x"})";
  EXPECT_EQ(make_passthrough_body(plain, must_index(plain)), plain);
}

// --- Prefill responses -----------------------------------------------------------

// Params in a prefill response come back as their exact raw text (nested block ids).
TEST(ExtractKvParams, ObjectByteIdentical) {
  const std::string resp = R"({"id":"cmpl-1","choices":[{"text":"a","kv_transfer_params":1}],)"
                           R"("kv_transfer_params":)" +
                           kPrefillParams + R"(,"usage":{"prompt_tokens":3}})";
  const auto r = extract_kv_params(resp);
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ(**r, kPrefillParams);
}

// Older engines' flat block id lists pass through untouched as well.
TEST(ExtractKvParams, FlatBlockIds) {
  const std::string params = R"({"do_remote_prefill":true,"remote_block_ids":[4, 5,6],)"
                             R"("remote_num_tokens":17,"remote_blocks_expiry_time":1.5e9})";
  const auto r = extract_kv_params(R"({"kv_transfer_params" :  )" + params + "\n}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->value(), params);
}

// null or absent params mean "no params"; invalid JSON and non-object params are errors.
TEST(ExtractKvParams, NullAbsentAndErrors) {
  auto r = extract_kv_params(R"({"kv_transfer_params":null})");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  r = extract_kv_params(R"({"choices":[]})");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_FALSE(extract_kv_params(R"({"kv_transfer_params":{)").ok());
  EXPECT_FALSE(extract_kv_params("").ok());
  EXPECT_FALSE(extract_kv_params(R"({"kv_transfer_params":[1]})").ok());
}

// --- Multi-turn helpers -----------------------------------------------------------

// Next-turn params point at the decode host and flip the direction flags; the rest stays
// byte-identical.
TEST(NextTurnParams, RewritesHostAndFlags) {
  const std::string decode_params =
      R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[7, 8]],)"
      R"("remote_engine_id":"d-uuid","remote_host":"0.0.0.0","remote_port":5601,"x":{"y":1}})";
  const auto r = kv_params_for_next_turn_prefill(decode_params, "10.0.0.2");
  ASSERT_TRUE(r.ok()) << r.error();
  const json j = parsed(*r);
  EXPECT_EQ(j["remote_host"], "10.0.0.2");
  EXPECT_EQ(j["do_remote_decode"], true);
  EXPECT_EQ(j["do_remote_prefill"], false);
  EXPECT_EQ(j["remote_port"], 5601);
  EXPECT_NE(r->find(R"("remote_block_ids":[[7, 8]])"), std::string::npos);
  EXPECT_NE(r->find(R"("x":{"y":1})"), std::string::npos);
}

// Missing flags and host are appended; a non-object is an error.
TEST(NextTurnParams, AppendsAndRejects) {
  const auto r = kv_params_for_next_turn_prefill(R"({"remote_block_ids":[1]})", "d\"host");
  ASSERT_TRUE(r.ok());
  const json j = parsed(*r);
  EXPECT_EQ(j["remote_host"], "d\"host");
  EXPECT_EQ(j["do_remote_decode"], true);
  EXPECT_EQ(j["do_remote_prefill"], false);
  EXPECT_FALSE(kv_params_for_next_turn_prefill("null", "h").ok());
  EXPECT_FALSE(kv_params_for_next_turn_prefill("[1]", "h").ok());
}

// strip_member removes a top-level member, and reports nullopt when there is none or the text is
// invalid.
TEST(StripMember, PresentAbsentInvalid) {
  const std::string chunk =
      R"({"id":"c","choices":[{"delta":{},"finish_reason":"stop"}],"kv_transfer_params":{"a":[1]}})";
  const auto s = strip_member(chunk, "kv_transfer_params");
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, R"({"id":"c","choices":[{"delta":{},"finish_reason":"stop"}]})");
  EXPECT_EQ(strip_member(R"({"a":{"kv_transfer_params":1}})", "kv_transfer_params"), std::nullopt);
  EXPECT_EQ(strip_member("not json", "kv_transfer_params"), std::nullopt);
}

// --- Spliced bodies (sent as buffers over the client's body) ---------------------

// Bodies covering what the edits meet: each edited field absent, present, duplicated, null,
// nested under another key, spelled with escapes, at the start or end, with odd whitespace,
// unicode, stream_options, an empty object.
std::vector<std::string> splice_corpus() {
  std::vector<std::string> c = {
      kCompletions,
      kChat,
      "{}",
      " { } ",
      R"({"prompt":"x"})",
      R"({"messages":[]})",
      R"({"stream":true})",
      R"({"conversation_id":"c"})",
      R"({"kv_transfer_params":{"a":1}})",
      R"({"kv_transfer_params":null,"prompt":"p"})",
      R"({"conversation_id":"c","kv_transfer_params":{},"stream":true,"max_tokens":3})",
      R"({"prompt":"p","conversation_id":12,"kv_transfer_params":[1]})",
      R"({"max_tokens":5,"max_tokens":6,"stream":false,"stream":true})",
      R"({"min_tokens":1,"stream_options":{"include_usage":true,"continuous_usage_stats":false},)"
      R"("prompt":"caf\u00e9 \ud83d\ude00 \"q\" \\ /","max_completion_tokens":9})",
      R"({"max\u005ftokens":7,"str\u0065am":true,"conversation\u005fid":"x"})",
      R"({"extra":{"stream":true,"max_tokens":9,"conversation_id":"inner",)"
      R"("kv_transfer_params":{"x":1}},"list":[{"stream_options":{}}],"prompt":"p"})",
      "{\n  \"model\" : \"m\" ,\n\t\"stream\" :\ttrue ,\r\n \"prompt\" : "
      "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"\n}\n",
      R"({"model":null,"stream":null,"stream_options":null,"max_tokens":null,"prompt":"p"})",
      R"({"prompt":"p","stream_options":{"include_usage":true}})",
      R"({"stream_options":{"include_usage":true},"prompt":"p"})",
  };
  // A long prompt: the case the splicing is for.
  std::string big = R"({"model":"m","prompt":")";
  for (int i = 0; i < 4096; ++i)
    big += "The quick brown fox \\u00e9 jumps. ";
  big += R"(","stream":true,"max_tokens":16,"conversation_id":"c1"})";
  c.push_back(std::move(big));
  return c;
}

// Every spliced body, concatenated, is byte for byte the rendered one, for every corpus body and
// every kind of params, and its pieces are views into the original wherever nothing changed.
TEST(SplicedBody, ConcatenationEqualsRendered) {
  const std::vector<std::optional<std::string_view>> decode_params = {
      std::nullopt, std::string_view("null"), std::string_view(" null "),
      std::string_view(kPrefillParams)};
  for (const std::string& body : splice_corpus()) {
    const auto idx = must_index(body);
    SCOPED_TRACE(body.substr(0, 200));
    const auto check = [&](const SplicedText& s, const std::string& rendered) {
      EXPECT_EQ(s.str(), rendered);
      EXPECT_EQ(s.size(), rendered.size());
      std::size_t total = 0;
      s.for_each([&](std::string_view piece) {
        EXPECT_FALSE(piece.empty());
        total += piece.size();
      });
      EXPECT_EQ(total, rendered.size());
      EXPECT_TRUE(index_json_object(s.str()).ok()) << s.str();
    };
    check(splice_prefill_body(body, idx), make_prefill_body(body, idx));
    check(splice_prefill_body(body, idx, kPrefillParams),
          make_prefill_body(body, idx, kPrefillParams));
    for (const auto& p : decode_params)
      check(splice_decode_body(body, idx, p), make_decode_body(body, idx, p));
    check(splice_passthrough_body(body, idx), make_passthrough_body(body, idx));
    // The one-token body (connectors without params) is the prefill body without any
    // kv_transfer_params.
    json expected = parsed(make_prefill_body(body, idx));
    expected.erase("kv_transfer_params");
    EXPECT_EQ(parsed(splice_one_token_body(body, idx).str()), expected);
  }
}

// The prompt is not copied: the spliced bodies of a long prompt are a few pieces, the prompt's
// bytes a view into the client's body, and the bytes owned by the splice a few hundred.
TEST(SplicedBody, PromptStaysInClientBuffer) {
  const std::string body = splice_corpus().back();
  const auto idx = must_index(body);
  const auto prompt = raw_member(body, idx, "prompt");
  ASSERT_TRUE(prompt);
  for (const SplicedText& s :
       {splice_prefill_body(body, idx), splice_decode_body(body, idx, kPrefillParams),
        splice_passthrough_body(body, idx), splice_one_token_body(body, idx)}) {
    EXPECT_LE(s.piece_count(), 8u);
    bool prompt_in_place = false;
    std::size_t outside = 0;
    s.for_each([&](std::string_view piece) {
      const bool inside = piece.data() >= body.data() && piece.data() < body.data() + body.size();
      if (!inside)
        outside += piece.size();
      if (inside && piece.find(*prompt) != std::string_view::npos)
        prompt_in_place = true;
    });
    EXPECT_TRUE(prompt_in_place);
    EXPECT_LT(outside, 600u);
  }
}

// A moved SplicedText (short fragments live inline in a small string) still yields its bytes.
TEST(SplicedBody, SurvivesMove) {
  const std::string body = R"({"stream":true,"prompt":"p"})";
  const auto idx = must_index(body);
  SplicedText a = splice_passthrough_body(body, idx);
  SplicedText moved_from = splice_prefill_body(body, idx);
  const std::string before = moved_from.str();
  SplicedText b = std::move(moved_from);
  std::vector<SplicedText> many;
  for (int i = 0; i < 16; ++i)
    many.push_back(splice_decode_body(body, idx, std::string_view(R"({"a":1})")));
  EXPECT_EQ(b.str(), before);
  EXPECT_EQ(a.str(), body);
  for (const auto& s : many)
    EXPECT_EQ(s.str(), make_decode_body(body, idx, std::string_view(R"({"a":1})")));
  EXPECT_EQ(SplicedText(body).str(), body);
  EXPECT_EQ(SplicedText().size(), 0u);
}

}  // namespace
}  // namespace pdgate
