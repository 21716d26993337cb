// Top-level facts of a completion request the gateway needs (model,
// stream, conversation id, ...), read once from the indexed body.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/base/json_body.hpp"
#include "core/base/result.hpp"

namespace pdgate {

// The OpenAI API a generation request speaks: its route.
enum class GenerationApi : std::uint8_t { completions, chat, responses };

// The member that holds a request's prompt: `prompt` (completions),
// `messages` (chat), `input` (responses: a string or a list of items).
std::string_view prompt_member(GenerationApi api);

// Top-level facts the gateway needs, read once from the indexed body.
struct RequestFacts {
  std::string model;  // empty when the client sent none
  bool stream = false;
  bool is_chat = false;
  // The client's conversation key for multi-turn KV reuse. A number is
  // accepted too and kept as its JSON text, since the Python proxy uses
  // whatever value it gets as a dictionary key.
  std::optional<std::string> conversation_id;
  bool include_usage = false;  // stream_options.include_usage
  // The completion's token limits as vLLM reads them (integral_value), or
  // nullopt when absent or null; a chat's max_completion_tokens only in
  // chat requests. A value vLLM would refuse is refused by read_facts.
  std::optional<std::int64_t> max_tokens;
  std::optional<std::int64_t> max_completion_tokens;
  // /v1/responses: its output limit (the only one it reads).
  std::optional<std::int64_t> max_output_tokens;
  // /v1/responses: the stored response this one continues, when given.
  std::optional<std::string> previous_response_id;
  // Size of the raw prompt member's value (prompt_member()): a cheap
  // proxy for prompt length when routing.
  std::size_t prompt_bytes = 0;
};

// Fails with a client-facing message when a field the gateway relies on has
// the wrong type (model not a string, stream not a boolean, stream_options
// not an object, conversation_id neither string nor number, a token limit
// that is not a whole number from 1 to 2^63 - 1; for /v1/responses, an
// `input` that is missing or neither a string nor a list, a
// previous_response_id that is not a string).
Result<RequestFacts> read_facts(std::string_view body, const JsonObjectIndex& index,
                                GenerationApi api);
inline Result<RequestFacts> read_facts(std::string_view body, const JsonObjectIndex& index,
                                       bool is_chat) {
  return read_facts(body, index, is_chat ? GenerationApi::chat : GenerationApi::completions);
}

}  // namespace pdgate
