// The connectors' prefill, decode and one-hop bodies (plugins/kv_bodies.hpp).
#include "plugins/kv_bodies.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/base/json_edit.hpp"
#include "plugins/kv_connectors.hpp"
#include "tests/unit/body_fixtures.hpp"

namespace pdgate {
namespace {

using nlohmann::json;
using test::kChat;
using test::kCompletions;
using test::kPrefillParams;
using test::must_index;
using test::parsed;

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

// The output-limit fields are a parameter (the Responses API's
// max_output_tokens), and min_completion_tokens goes with min_tokens.
TEST(PrefillBody, OneTokenFieldsAreAParameter) {
  const std::string body =
      R"({"input":"hi","max_output_tokens":50,"min_tokens":3,"min_completion_tokens":2})";
  const json j = parsed(make_prefill_body(body, must_index(body), kDefaultPrefillKvParams,
                                          {"max_output_tokens", ""}));
  EXPECT_EQ(j["max_output_tokens"], 1);
  EXPECT_FALSE(j.contains("max_tokens"));
  EXPECT_FALSE(j.contains("min_tokens"));
  EXPECT_FALSE(j.contains("min_completion_tokens"));
  EXPECT_EQ(j["input"], "hi");
}

// Each connector's form, read from its table: legs, params, ids.
TEST(ConnectorForms, DeclaredAsData) {
  const auto nixl = make_kv_connector("nixl");
  ASSERT_TRUE(nixl);
  EXPECT_EQ(nixl->form().order, LegOrder::sequential);
  EXPECT_TRUE(nixl->passes_params());
  const auto mooncake = make_kv_connector("mooncake");
  ASSERT_TRUE(mooncake);
  EXPECT_TRUE(mooncake->parallel());
  EXPECT_FALSE(mooncake->passes_params());
  const auto older = make_kv_connector("mooncake", {.mooncake_parallel = false});
  EXPECT_EQ(older->form().order, LegOrder::sequential);
  EXPECT_TRUE(older->passes_params());
  EXPECT_TRUE(make_kv_connector("p2p-nccl")->names_peers());
  EXPECT_FALSE(make_kv_connector("none")->has_prefill());
  EXPECT_FALSE(make_kv_connector("lmcache")->passes_params());
  EXPECT_FALSE(make_kv_connector("bogus"));
}

// NIXL push: the decode body keeps the client's bytes (the prompt is not
// copied) and carries prefill's coordinates only; forced pull relays.
TEST(ConnectorForms, NixlPushDecodeBody) {
  const std::string answer =
      R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[4]],)"
      R"("remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":7,)"
      R"("tp_size":1,"transfer_mode":"push"})";
  const auto idx = must_index(kChat);
  const auto push = make_kv_connector("nixl")->decode_body(kChat, idx, answer);
  ASSERT_TRUE(push.ok()) << push.error();
  const json j = parsed(push->str());
  EXPECT_FALSE(j["kv_transfer_params"].contains("remote_block_ids"));
  EXPECT_EQ(j["kv_transfer_params"]["remote_port"], 7);
  EXPECT_EQ(j["messages"], parsed(kChat)["messages"]);
  const auto pull = make_kv_connector("nixl", {.nixl_mode = NixlTransferMode::pull})
                        ->decode_body(kChat, idx, answer);
  ASSERT_TRUE(pull.ok());
  EXPECT_EQ(parsed(pull->str())["kv_transfer_params"], json::parse(answer));
  const auto broken = make_kv_connector("nixl")->decode_body(
      kChat, idx, std::string_view(R"({"transfer_mode":"push","remote_host":"h"})"));
  EXPECT_FALSE(broken.ok());
}

}  // namespace
}  // namespace pdgate
