// The tokenize phase (--tokenizer vllm): the prompt's token ids, asked of
// an engine's POST /tokenize before routing, so policies read exact cached
// tokens (pdgate.cached_tokens()) for any model and chat template. It
// never fails a request: without an answer in --tokenizer-timeout the
// request is routed without exact data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "core/request_context.hpp"

namespace pdgate {

// The /tokenize body for a request: its model (raw JSON, when given) and
// its prompt (completions) or messages (chat, with the generation prompt
// the engine would add), as vLLM's tokenize endpoint takes them.
std::string tokenize_body(bool chat, std::optional<std::string_view> model_raw,
                          std::string_view prompt_raw);

// The ids of a /tokenize answer ({"count", "max_model_len", "tokens"}), or
// nothing when it is not one (a token that is not a 32-bit id included).
std::optional<std::vector<std::uint32_t>> parse_tokenize_answer(std::string_view answer);

// Fills rc.token_ids and points the pick context at them, or leaves them
// empty. One decode instance is asked, chosen by the request id.
boost::asio::awaitable<void> tokenize_phase(RequestContext& rc);

}  // namespace pdgate
