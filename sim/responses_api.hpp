// vLLM's Responses API (/v1/responses) as the sim answers it: the prompt a
// ResponsesRequest's `instructions` and `input` make, the response object
// and the stream of named events (`event: <type>` + `data: <json>`) that
// vLLM's simple (non-Harmony) path emits, checked against vLLM's
// vllm/entrypoints/openai/responses/protocol.py, simple_streaming_events.py
// and api_router.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sim/responses.hpp"
#include "sim/tokenizer.hpp"

namespace pdgate::sim {

// The prompt of a ResponsesRequest: `instructions` as a system message,
// then `input`, a string (one user message) or a list of items (messages
// with string or input_text / input_image parts; other items count by
// their JSON text), under the chat prompt rules (tokenizer.hpp).
PromptResult responses_prompt(const nlohmann::json& body);

// One response: its ids and what it echoes of the request.
class ResponsesAnswer {
 public:
  // `rid`: the request id (the response is "resp_<rid>", its message
  // "msg_<rid>"); `request`: the client's body, whose fields it echoes.
  ResponsesAnswer(const std::string& rid, std::string model, std::int64_t created,
                  const nlohmann::json& request, std::size_t max_output_tokens);

  // The stream's first events: response.created, response.in_progress,
  // response.output_item.added, response.content_part.added.
  std::string start_events();
  // One response.output_text.delta.
  std::string delta_event(std::string_view text);
  // The last events: response.output_text.done, response.content_part.done,
  // response.output_item.done, response.completed (the whole response,
  // usage and kv_transfer_params included).
  std::string finish_events(std::string_view text, const Usage& u, std::size_t cached,
                            const ojson& kv_params);
  // The non-streamed answer: the response object.
  ojson whole(std::string_view text, const Usage& u, std::size_t cached, const ojson& kv_params);

 private:
  ojson response(std::string_view status, const ojson& output, const ojson& usage,
                 const ojson& kv_params) const;
  ojson message(std::string_view status, std::string_view text) const;
  std::string event(ojson j);

  std::string id_;
  std::string item_id_;
  std::string model_;
  std::int64_t created_;
  ojson echo_;
  std::size_t max_output_tokens_;
  std::int64_t sequence_ = 0;
};

// `event: <type>\ndata: <json>\n\n`, as vLLM's api_router writes them.
std::string sse_named_event(std::string_view type, const ojson& j);

}  // namespace pdgate::sim
