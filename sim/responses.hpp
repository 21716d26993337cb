// JSON bodies in vLLM's OpenAI-server shapes (key order included, hence
// ordered_json): completions, chat completions, their SSE chunks, errors,
// the model list and the NIXL kv_transfer_params object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace pdgate::sim {

using ojson = nlohmann::ordered_json;

struct ResponseMeta {
  std::string id;  // "cmpl-<rid>" or "chatcmpl-<rid>"
  std::string model;
  std::int64_t created = 0;
  bool chat = false;
};

struct Usage {
  std::size_t prompt_tokens = 0;
  std::size_t completion_tokens = 0;
  // --enable-prompt-tokens-details: prompt tokens found cached (vLLM
  // reports them only when non-zero); 0 leaves the details out.
  std::size_t cached_tokens = 0;
};

// vLLM's prompt_logprobs of `prompt_text` (the sim's tokens: 4 bytes
// each): null for the first token, then per token {"<id>": {"logprob",
// "rank", "decoded_token"}}, the logprob a deterministic function of the
// id, so a test can tell whose they are.
ojson make_prompt_logprobs(std::string_view prompt_text);

// Non-streaming body; kv_params is null or the params object.
ojson make_response(const ResponseMeta& m, std::string_view text, std::string_view finish_reason,
                    const Usage& u, const ojson& kv_params);

// Chat's first chunk: delta {"role":"assistant","content":""}.
ojson make_role_chunk(const ResponseMeta& m);
// One output token; finish_reason empty = null.
ojson make_token_chunk(const ResponseMeta& m, std::string_view text,
                       std::string_view finish_reason);
// stream_options.include_usage: choices [] and usage.
ojson make_usage_chunk(const ResponseMeta& m, const Usage& u);

std::string sse_event(const ojson& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// {"error": {"message", "type", "param": null, "code"}}.
ojson make_error(std::string_view message, int code);
const char* error_type_for(int code);

ojson make_models(const std::string& model, std::size_t max_model_len, std::int64_t created,
                  const std::string& permission_id);

// The kv_transfer_params an engine answers (vLLM's NIXL schedulers'
// request_finished); `transfer_mode` pull or push.
ojson make_kv_params(const std::vector<std::int64_t>& block_ids, const std::string& engine_id,
                     const std::string& remote_request_id, const std::string& host,
                     std::uint16_t port, std::string_view transfer_mode = "pull");

}  // namespace pdgate::sim
