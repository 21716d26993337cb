// last_usage: the token counts an engine reports, found from the end.
#include "core/observability/usage.hpp"

#include <gtest/gtest.h>

#include <string>

namespace pdgate {
namespace {

// A whole answer's usage (vLLM writes it last) is read, whitespace or not.
TEST(LastUsage, WholeAnswer) {
  const auto u =
      last_usage(R"({"id":"x","choices":[{"text":"hi"}],"usage" : {"prompt_tokens": 12, )"
                 R"("total_tokens": 17, "completion_tokens": 5, "prompt_tokens_details": null}})");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 12u);
  EXPECT_EQ(u->completion_tokens, 5u);
}

// In a stream asked with include_usage, the token events carry "usage":
// null and the final event the counts: the last one wins.
TEST(LastUsage, StreamTakesTheLastEvent) {
  const std::string events =
      "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\n"
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,"
      "\"total_tokens\":5}}\n\n"
      "data: [DONE]\n\n";
  const auto u = last_usage(events);
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 3u);
  EXPECT_EQ(u->completion_tokens, 2u);
  // A stretch whose last usage is null reports none (the counts are still to come).
  EXPECT_FALSE(
      last_usage("data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n"
                 "data: {\"usage\": null}\n\n"));
}

// Text that only mentions usage, a cut-off object, negative or
// non-integer counts, and a key inside a string are no usage.
TEST(LastUsage, RejectsWhatIsNotUsage) {
  EXPECT_FALSE(last_usage(""));
  // In events a usage object broken by a line break is cut off (found by
  // fuzz_sse: bytes after the complete events completed it); a whole JSON
  // answer may break lines anywhere.
  const std::string broken =
      "data: {\"usage\": {\"prompt_tokens\":\r\r 4, \"completion_tokens\": 1}}";
  EXPECT_FALSE(last_usage(broken, true));
  EXPECT_TRUE(last_usage(broken));
  EXPECT_FALSE(last_usage(R"({"text":"the \"usage\": {\"prompt_tokens\": 1}"})"));
  EXPECT_FALSE(last_usage(R"({"usage": {"prompt_tokens": 1, "completion_tokens": 2)"));
  EXPECT_FALSE(last_usage(R"({"usage": {"prompt_tokens": -1, "completion_tokens": 2}})"));
  EXPECT_FALSE(last_usage(R"({"usage": {"prompt_tokens": 1.5, "completion_tokens": 2}})"));
  EXPECT_FALSE(last_usage(R"({"usage": {"prompt_tokens": 1}})"));
  EXPECT_FALSE(last_usage(R"({"object": "usage"})"));
}

// Braces inside strings of the usage object do not end it early.
TEST(LastUsage, StringsInsideTheObject) {
  const auto u = last_usage(
      R"({"usage": {"note": "a } b { \" }", "prompt_tokens": 7, "completion_tokens": 0}})");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 7u);
  EXPECT_EQ(u->completion_tokens, 0u);
}

// A string's end is its first quote not escaped by an odd run of
// backslashes; a 'g' after the key (reasoning_tokens) does not hide it.
TEST(LastUsage, BackslashRunsAndLettersAfterTheKey) {
  const auto u = last_usage(
      R"({"usage": {"a": "ends in a backslash \\", "b": "\\\" } {", "prompt_tokens": 2, )"
      R"("completion_tokens_details": {"reasoning_tokens": 1}, "completion_tokens": 3}})");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 2u);
  EXPECT_EQ(u->completion_tokens, 3u);
  // The last "usage" is a string value: no counts, whatever came before.
  EXPECT_FALSE(
      last_usage(R"({"usage": {"prompt_tokens": 1, "completion_tokens": 2}, "x": "usage"})"));
  // In events a carriage return inside the object cuts it off too.
  EXPECT_FALSE(
      last_usage("data: {\"usage\": {\"prompt_tokens\": 1,\r\"completion_tokens\": 2}}", true));
}

// Only the usage object's own members count: a nested object's keys of the
// same name do not, whatever their order; exponents and counts past 64
// bits are no counts (the scan reads them in place, without a JSON parse).
TEST(LastUsage, OwnMembersOnly) {
  const auto u = last_usage(
      R"({"usage": {"prompt_tokens_details": {"prompt_tokens": 99, "completion_tokens": 98},)"
      R"( "prompt_tokens": 7, "x": [{"completion_tokens": 1}], "completion_tokens" : 3 }})");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 7u);
  EXPECT_EQ(u->completion_tokens, 3u);
  EXPECT_FALSE(last_usage(R"({"usage": {"prompt_tokens": 1e3, "completion_tokens": 2}})"));
  EXPECT_FALSE(
      last_usage(R"({"usage": {"prompt_tokens": 18446744073709551616, "completion_tokens": 2}})"));
  EXPECT_FALSE(last_usage(R"({"usage": {"prompt_tokens": "1", "completion_tokens": 2}})"));
  const auto max =
      last_usage(R"({"usage": {"prompt_tokens": 18446744073709551615, "completion_tokens": 0}})");
  ASSERT_TRUE(max);
  EXPECT_EQ(max->prompt_tokens, 18446744073709551615u);
}

// The last "usage" is the one read, wherever it is: at the very start of
// the text, or with others before it.
TEST(LastUsage, LastKeyWherever) {
  const auto first = last_usage(R"("usage":{"prompt_tokens":1,"completion_tokens":2})");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->prompt_tokens, 1u);
  const auto last = last_usage(
      R"({"usage":{"prompt_tokens":1,"completion_tokens":2},"x":{"usage":{"prompt_tokens":7,)"
      R"("completion_tokens":9}}})");
  ASSERT_TRUE(last);
  EXPECT_EQ(last->prompt_tokens, 7u);
  EXPECT_EQ(last->completion_tokens, 9u);
  EXPECT_FALSE(last_usage("\"usage\""));
  EXPECT_FALSE(last_usage("usage\""));
}

// The Responses API names the counts input_tokens and output_tokens; its
// response.completed event carries them under "response".
TEST(LastUsage, ResponsesShape) {
  const std::string events =
      "event: response.created\ndata: {\"response\":{\"usage\":null},\"type\":\"r\"}\n\n"
      "event: response.completed\ndata: {\"response\":{\"usage\":{\"input_tokens\":9,"
      "\"input_tokens_details\":{\"cached_tokens\":4,\"input_tokens_per_turn\":[]},"
      "\"output_tokens\":5,\"output_tokens_details\":{\"reasoning_tokens\":0},"
      "\"total_tokens\":14},\"user\":null},\"type\":\"response.completed\"}\n\n";
  const auto u = last_usage(events, true);
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 9u);
  EXPECT_EQ(u->completion_tokens, 5u);
}

// Prefill's cached_tokens: vLLM leaves the details out (null) when 0.
TEST(PromptCachedTokens, ReadFromAWholeAnswer) {
  EXPECT_EQ(prompt_cached_tokens(
                R"({"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":4}}})"),
            4u);
  EXPECT_EQ(prompt_cached_tokens(R"({"usage":{"prompt_tokens":9,"prompt_tokens_details":null}})"),
            0u);
  EXPECT_EQ(prompt_cached_tokens(R"({"usage":{"prompt_tokens":9}})"), 0u);
  EXPECT_FALSE(prompt_cached_tokens(R"({"choices":[]})"));
  EXPECT_FALSE(prompt_cached_tokens(R"({"usage":{"prompt_tokens_details":{"cached_tokens":-1}}})"));
  EXPECT_FALSE(prompt_cached_tokens("not json"));
}

// Decode's usage with prefill's count; other bytes kept, and nothing
// added where decode reports no details.
TEST(PromptCachedTokens, MergedIntoDecodesUsage) {
  const std::string event =
      R"({"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,)"
      R"("prompt_tokens_details":{"cached_tokens":9}}})";
  const auto merged = with_cached_tokens(event, 3);
  ASSERT_TRUE(merged);
  EXPECT_EQ(*merged, R"({"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,)"
                     R"("prompt_tokens_details":{"cached_tokens":3}}})");
  EXPECT_FALSE(with_cached_tokens(R"({"usage":{"prompt_tokens":9}})", 3));
  EXPECT_FALSE(with_cached_tokens(R"({"usage":{"prompt_tokens_details":null}})", 3));
  EXPECT_FALSE(with_cached_tokens(R"({"usage":null})", 3));
  EXPECT_FALSE(with_cached_tokens("[1]", 3));
}

}  // namespace
}  // namespace pdgate
