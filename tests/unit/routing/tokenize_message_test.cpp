// The /tokenize messages: the body built from a request, and the answer
// read back (--tokenizer vllm).
#include "core/routing/tokenize_message.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pdgate {
namespace {

// A completion's prompt and a chat's messages go as vLLM's endpoint takes
// them, the model passed through; chat asks for the generation prompt.
TEST(TokenizeBody, CompletionAndChat) {
  const auto completion = nlohmann::json::parse(tokenize_body(false, "\"m\"", "\"hello\""));
  EXPECT_EQ(completion, nlohmann::json({{"model", "m"}, {"prompt", "hello"}}));
  const auto chat = nlohmann::json::parse(
      tokenize_body(true, std::nullopt, R"([{"role":"user","content":"hi"}])"));
  EXPECT_EQ(chat["messages"][0]["content"], "hi");
  EXPECT_EQ(chat["add_generation_prompt"], true);
  EXPECT_FALSE(chat.contains("model"));
}

// An answer's ids are read; anything else (no tokens, a negative or
// 33-bit id, a string, not JSON) gives no ids at all.
TEST(TokenizeAnswer, IdsOrNothing) {
  const auto ids =
      parse_tokenize_answer(R"({"count":3,"max_model_len":8,"tokens":[1,0,4294967295]})");
  ASSERT_TRUE(ids);
  EXPECT_EQ(*ids, (std::vector<std::uint32_t>{1, 0, 4294967295u}));
  EXPECT_TRUE(parse_tokenize_answer(R"({"tokens":[]})"));
  for (const char* bad : {R"({"count":3})", R"({"tokens":[1,-2]})", R"({"tokens":[4294967296]})",
                          R"({"tokens":["a"]})", R"({"tokens":{}})", "[1,2]", "not json", ""}) {
    EXPECT_FALSE(parse_tokenize_answer(bad)) << bad;
  }
}

}  // namespace
}  // namespace pdgate
