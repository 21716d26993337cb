#include "core/pipeline/prompt_logprobs.hpp"

#include <gtest/gtest.h>

#include <string>

namespace pdgate {
namespace {

// Prefill's prompt_logprobs are read where vLLM puts them: choices[0]'s
// (completions), else the top level (chat); null or absent is none.
TEST(PromptLogprobs, ReadFromPrefillsAnswer) {
  EXPECT_EQ(prompt_logprobs_of(R"({"choices":[{"prompt_logprobs":[null,{"7":{"logprob":-1}}]}]})"),
            R"([null,{"7":{"logprob":-1}}])");
  EXPECT_EQ(prompt_logprobs_of(R"({"choices":[{}],"prompt_logprobs":[null]})"), "[null]");
  EXPECT_FALSE(prompt_logprobs_of(R"({"choices":[{"prompt_logprobs":null}]})"));
  EXPECT_FALSE(prompt_logprobs_of("not json"));
}

// Decode's null ones are filled (each choice's, the top level's), every
// other byte of the answer kept in order; nothing to fill is nullopt.
TEST(PromptLogprobs, FillDecodesNullOnes) {
  EXPECT_EQ(
      with_prompt_logprobs(
          R"({"id":"x","choices":[{"text":"a","prompt_logprobs":null},{"text":"b","prompt_logprobs":null}]})",
          "[null,1]"),
      R"({"id":"x","choices":[{"text":"a","prompt_logprobs":[null,1]},{"text":"b","prompt_logprobs":[null,1]}]})");
  EXPECT_EQ(with_prompt_logprobs(R"({"z":1,"prompt_logprobs":null,"a":2})", "[null]"),
            R"({"z":1,"prompt_logprobs":[null],"a":2})");
  EXPECT_FALSE(with_prompt_logprobs(R"({"prompt_logprobs":[null]})", "[null,1]"));
  EXPECT_FALSE(with_prompt_logprobs(R"({"choices":[]})", "[null]"));
}

// An engine's answer nested past the JSON depth bound is left alone, never
// parsed and written back (writing it back recurses once per level).
TEST(PromptLogprobs, DeeplyNestedAnswersAreLeftAlone) {
  const std::string deep = std::string(200'000, '[') + std::string(200'000, ']');
  EXPECT_FALSE(with_prompt_logprobs(R"({"prompt_logprobs":null,"x":)" + deep + "}", "[null]"));
  EXPECT_FALSE(with_prompt_logprobs(R"({"prompt_logprobs":null})", deep));
  EXPECT_FALSE(prompt_logprobs_of(R"({"prompt_logprobs":)" + deep + "}"));
}

}  // namespace
}  // namespace pdgate
