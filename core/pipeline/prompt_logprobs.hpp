// prompt_logprobs in P/D: only the engine that computed the prompt can
// give them, and that is prefill; decode, which received the prompt's KV,
// answers null. A client that asked for them gets prefill's, put where
// vLLM puts them in an answer: each choice's `prompt_logprobs` for
// completions, the top-level `prompt_logprobs` for chat.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pdgate {

// The prompt_logprobs of prefill's whole answer (choices[0]'s, else the
// top-level one), as JSON text; nullopt when it has none (null, absent,
// not JSON).
std::optional<std::string> prompt_logprobs_of(std::string_view answer);

// Decode's whole answer with every null `prompt_logprobs` it has (the
// top-level one, each choice's) set to `logprobs` (JSON text); nullopt
// when nothing changes (no such field, already set, not JSON).
std::optional<std::string> with_prompt_logprobs(std::string_view answer, std::string_view logprobs);

}  // namespace pdgate
