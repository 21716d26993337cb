#include <gtest/gtest.h>

#include "sim/tokenizer.hpp"

namespace pdgate::sim {
namespace {

using nlohmann::json;

// A string prompt costs ceil(bytes/4) tokens.
TEST(SimTokenizer, StringPromptIsBytesOverFourRoundedUp) {
  EXPECT_EQ(completion_prompt(json{{"prompt", "abcd"}}).prompt.tokens, 1u);
  EXPECT_EQ(completion_prompt(json{{"prompt", "abcde"}}).prompt.tokens, 2u);
  EXPECT_EQ(completion_prompt(json{{"prompt", std::string(400, 'x')}}).prompt.tokens, 100u);
}

// A list of strings uses the first; a token-id list counts its length.
TEST(SimTokenizer, ListPrompts) {
  auto r = completion_prompt(json{{"prompt", {"abcdefgh", "z"}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.prompt.text, "abcdefgh");
  EXPECT_EQ(r.prompt.tokens, 2u);
  r = completion_prompt(json{{"prompt", {1, 2, 3, 4, 5}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.prompt.tokens, 5u);
  r = completion_prompt(json{{"prompt", {{7, 8, 9}, {1}}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.prompt.tokens, 3u);
}

// Missing, empty or wrongly typed prompts are errors (400 upstream).
TEST(SimTokenizer, BadPrompts) {
  EXPECT_FALSE(completion_prompt(json::object()).ok());
  EXPECT_FALSE(completion_prompt(json{{"prompt", ""}}).ok());
  EXPECT_FALSE(completion_prompt(json{{"prompt", 42}}).ok());
  EXPECT_FALSE(completion_prompt(json{{"prompt", json::array()}}).ok());
}

// Chat text is role + content for every message, string or text parts.
TEST(SimTokenizer, ChatConcatenatesRolesAndText) {
  json body = {
      {"messages",
       {{{"role", "system"}, {"content", "be brief"}},
        {{"role", "user"},
         {"content",
          {{{"type", "text"}, {"text", "hi "}}, {{"type", "text"}, {"text", "there"}}}}}}}};
  auto r = chat_prompt(body);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.prompt.text, "systembe briefuserhi there");
  EXPECT_EQ(r.prompt.tokens, tokens_for_bytes(26));
  EXPECT_EQ(r.prompt.text_items, 3u);
  EXPECT_EQ(r.prompt.media_items, 0u);
}

// Each media part adds exactly 64 tokens and identical media share bytes.
TEST(SimTokenizer, MediaPartsCostSixtyFourTokensAndHashTheirBytes) {
  auto with = [](const std::string& url) {
    return json{{"messages",
                 {{{"role", "user"},
                   {"content",
                    {{{"type", "text"}, {"text", "describe"}},
                     {{"type", "image_url"}, {"image_url", {{"url", url}}}}}}}}}};
  };
  auto a = chat_prompt(with("http://x/cat.png"));
  auto b = chat_prompt(with("http://x/cat.png"));
  auto c = chat_prompt(with("http://x/dog.png"));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.prompt.tokens, tokens_for_bytes(std::string("userdescribe").size()) + kMediaTokens);
  EXPECT_EQ(a.prompt.media_items, 1u);
  EXPECT_EQ(a.prompt.text, b.prompt.text);
  EXPECT_NE(a.prompt.text, c.prompt.text);
  EXPECT_EQ(a.prompt.tokens, c.prompt.tokens);
}

// Unknown part types and message-less bodies are rejected.
TEST(SimTokenizer, ChatErrors) {
  EXPECT_FALSE(chat_prompt(json::object()).ok());
  EXPECT_FALSE(chat_prompt(json{{"messages", json::array()}}).ok());
  EXPECT_FALSE(
      chat_prompt(json{{"messages", {{{"role", "user"}, {"content", {{{"type", "video"}}}}}}}})
          .ok());
}

// Output tokens are fixed words by position, each with a leading space.
TEST(SimTokenizer, OutputIsDeterministic) {
  EXPECT_EQ(output_token(0), " the");
  EXPECT_EQ(output_token(1), " quick");
  EXPECT_EQ(output_token(16), output_token(0));
  EXPECT_EQ(output_text(3), " the quick brown");
}

// A text that ends with the first k output tokens continues at token k:
// the longest such run counts, however the cycle of words repeats, and
// anything else (a partial word, a run not starting at the first word)
// starts from 0.
TEST(SimTokenizer, ContinuationOffsetFindsTheAnswerSoFar) {
  EXPECT_EQ(continuation_offset(""), 0u);
  EXPECT_EQ(continuation_offset("Say something"), 0u);
  EXPECT_EQ(continuation_offset("prompt" + output_text(1)), 1u);
  EXPECT_EQ(continuation_offset("prompt" + output_text(5)), 5u);
  EXPECT_EQ(continuation_offset(output_text(40)), 40u);
  EXPECT_EQ(continuation_offset("x" + output_text(17)), 17u);
  // " quick brown" without " the" before it is no answer so far.
  EXPECT_EQ(continuation_offset("prompt quick brown"), 0u);
  EXPECT_EQ(continuation_offset("prompt" + output_text(3) + "s"), 0u);
  // The answer resumed after k tokens is the uninterrupted one's rest.
  for (std::size_t k : {0u, 1u, 7u, 16u, 33u}) {
    const std::size_t from = continuation_offset("Tell me" + output_text(k));
    EXPECT_EQ(
        output_text(k) +
            [&] {
              std::string rest;
              for (std::size_t i = 0; i < 10; ++i)
                rest += output_token(from + i);
              return rest;
            }(),
        output_text(k + 10));
  }
}

// The same for a token-id prompt (a gateway resuming token-exact): the
// output ids it ends with, a run from token 0 in order.
TEST(SimTokenizer, ContinuationOffsetOfTokenIds) {
  auto ids_of = [](std::vector<std::uint32_t> prompt, std::size_t k) {
    for (std::size_t i = 0; i < k; ++i)
      prompt.push_back(output_token_id(i));
    return prompt;
  };
  EXPECT_EQ(output_token_id(0), 0xFFFF0000u);
  EXPECT_EQ(output_token_id(17), 0xFFFF0001u);
  EXPECT_EQ(continuation_offset(std::vector<std::uint32_t>{}), 0u);
  for (std::size_t k : {0u, 1u, 5u, 16u, 40u})
    EXPECT_EQ(continuation_offset(ids_of(token_ids("Tell me"), k)), k) << k;
  // Output ids not starting at token 0, or out of order, are no answer.
  EXPECT_EQ(continuation_offset(std::vector<std::uint32_t>{7, output_token_id(1)}), 0u);
  EXPECT_EQ(continuation_offset(std::vector<std::uint32_t>{output_token_id(0), output_token_id(2)}),
            0u);
  // No prompt text makes an output id: its bytes' top one would be 0xFF.
  for (const auto id : token_ids("Tell me \xc3\xa9 \xf0\x9f\x98\x80 story"))
    EXPECT_LT(id, output_token_id(0));
}

// The encoder accepts exactly one media item, no text, max_tokens 1, no stream.
TEST(SimTokenizer, EncoderRules) {
  json item = {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,AAAA"}}}};
  json ok = {{"model", "m"},
             {"messages", {{{"role", "user"}, {"content", {item}}}}},
             {"max_tokens", 1},
             {"stream", false}};
  EXPECT_EQ(encoder_violation(ok, true), "");
  EXPECT_NE(encoder_violation(ok, false), "");  // completions endpoint

  json two = ok;
  two["messages"][0]["content"].push_back(item);
  EXPECT_NE(encoder_violation(two, true).find("exactly one"), std::string::npos);

  json text = ok;
  text["messages"][0]["content"].push_back({{"type", "text"}, {"text", "hi"}});
  EXPECT_NE(encoder_violation(text, true).find("text"), std::string::npos);

  json tokens = ok;
  tokens["max_tokens"] = 2;
  EXPECT_NE(encoder_violation(tokens, true).find("max_tokens"), std::string::npos);
  tokens.erase("max_tokens");
  EXPECT_NE(encoder_violation(tokens, true).find("max_tokens"), std::string::npos);

  json stream = ok;
  stream["stream"] = true;
  EXPECT_NE(encoder_violation(stream, true).find("stream"), std::string::npos);
}

// Token i is the little-endian uint32 of bytes [4i, 4i+4); the last is zero-padded.
TEST(SimTokenizer, TokenIdsAreLittleEndianWordsOfThePrefixText) {
  const std::vector<std::uint32_t> ids = token_ids("abcdefghi");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], 0x64636261u);  // "abcd"
  EXPECT_EQ(ids[1], 0x68676665u);  // "efgh"
  EXPECT_EQ(ids[2], 0x00000069u);  // "i" + 3 zero bytes
  EXPECT_TRUE(token_ids("").empty());
}

// Bytes >= 0x80 are taken unsigned, and the id count is always the token count.
TEST(SimTokenizer, TokenIdsUseUnsignedBytesAndMatchTheTokenCount) {
  const std::string text = "\xff\x80\x01\xfe\xc3\xa9";
  const std::vector<std::uint32_t> ids = token_ids(text);
  ASSERT_EQ(ids.size(), tokens_for_bytes(text.size()));
  EXPECT_EQ(ids[0], 0xfe0180ffu);
  EXPECT_EQ(ids[1], 0x0000a9c3u);
  auto r = chat_prompt(json{{"messages", {{{"role", "user"}, {"content", "héllo wörld"}}}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(token_ids(r.prompt.text).size(), r.prompt.tokens);
}

// A token-id prompt's ids come back unchanged, so clients sending ids see them in events.
TEST(SimTokenizer, TokenIdPromptRoundTrips) {
  const std::vector<std::uint32_t> sent = {0, 1, 70000, 4294967295u, 42};
  auto r = completion_prompt(json{{"prompt", sent}});
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(token_ids(r.prompt.text), sent);
}

// Different texts of the same length give different ids (the ids are a bijection of the bytes).
TEST(SimTokenizer, TokenIdsDistinguishEveryByte) {
  std::string a(12, 'x');
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::string b = a;
    b[i] = 'y';
    EXPECT_NE(token_ids(a), token_ids(b)) << "byte " << i;
  }
}

}  // namespace
}  // namespace pdgate::sim
