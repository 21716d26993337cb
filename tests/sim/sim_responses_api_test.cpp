// The sim's Responses API shapes (sim/responses_api.hpp): the prompt an
// `input` makes, the event sequence and the response object.
#include "sim/responses_api.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pdgate::sim {
namespace {

using nlohmann::json;

// The events of a stream, as (type, data) pairs.
std::vector<std::pair<std::string, json>> events_of(const std::string& text) {
  std::vector<std::pair<std::string, json>> out;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find("\n\n", at);
    const std::string e = text.substr(at, end - at);
    EXPECT_EQ(e.rfind("event: ", 0), 0u) << e;
    const std::size_t nl = e.find('\n');
    const std::string type = e.substr(7, nl - 7);
    EXPECT_EQ(e.substr(nl + 1, 6), "data: ") << e;
    out.emplace_back(type, json::parse(e.substr(nl + 7)));
    at = end + 2;
  }
  return out;
}

// A string input is one user message; a list of items reads their text
// parts as a chat's messages would; instructions come first.
TEST(SimResponsesApi, PromptFromInput) {
  const auto s = responses_prompt(json{{"input", "hello"}});
  ASSERT_TRUE(s.ok()) << s.error;
  const auto same = chat_prompt(json{{"messages", {{{"role", "user"}, {"content", "hello"}}}}});
  EXPECT_EQ(s.prompt.text, same.prompt.text);
  const auto items = responses_prompt(json{
      {"instructions", "be brief"},
      {"input", {{{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "hello"}}}}}}}});
  ASSERT_TRUE(items.ok()) << items.error;
  const auto chat = chat_prompt(
      json{{"messages",
            {{{"role", "system"}, {"content", "be brief"}},
             {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hello"}}}}}}}});
  EXPECT_EQ(items.prompt.text, chat.prompt.text);
  EXPECT_FALSE(responses_prompt(json{{"model", "m"}}).ok());
  EXPECT_FALSE(responses_prompt(json{{"input", 3}}).ok());
}

// vLLM's simple streaming order, numbered from 0, with the usage and the
// params on response.completed.
TEST(SimResponsesApi, EventSequence) {
  ResponsesAnswer a("abc", "sim-model", 1700000000, json{{"input", "x"}}, 2);
  // One call after the other: each numbers its events on from the last.
  std::string text = a.start_events();
  text += a.delta_event(" the");
  text += a.delta_event(" quick");
  text += a.finish_events(" the quick", Usage{7, 2}, 4, ojson{{"k", 1}});
  const auto ev = events_of(text);
  const std::vector<std::string> want = {
      "response.created",           "response.in_progress",
      "response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.delta",
      "response.output_text.done",  "response.content_part.done",
      "response.output_item.done",  "response.completed"};
  ASSERT_EQ(ev.size(), want.size());
  for (std::size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].first, want[i]);
    EXPECT_EQ(ev[i].second["type"], want[i]);
    EXPECT_EQ(ev[i].second["sequence_number"], i);
  }
  EXPECT_EQ(ev[0].second["response"]["id"], "resp_abc");
  EXPECT_EQ(ev[0].second["response"]["status"], "in_progress");
  EXPECT_EQ(ev[4].second["delta"], " the");
  EXPECT_EQ(ev[4].second["item_id"], "msg_abc");
  EXPECT_EQ(ev[6].second["text"], " the quick");
  const json& done = ev.back().second["response"];
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["output"][0]["content"][0]["text"], " the quick");
  EXPECT_EQ(done["usage"]["input_tokens"], 7);
  EXPECT_EQ(done["usage"]["input_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(done["usage"]["output_tokens"], 2);
  EXPECT_EQ(done["usage"]["total_tokens"], 9);
  EXPECT_EQ(done["max_output_tokens"], 2);
  EXPECT_EQ(done["kv_transfer_params"]["k"], 1);
}

}  // namespace
}  // namespace pdgate::sim
