// The messages of an engine's POST /tokenize (vLLM's endpoint, used by
// --tokenizer vllm): the body pdgate sends for a request, and the token ids
// read from the answer. Pure functions (unit-tested and fuzzed); the call
// itself is core/tokenize_phase.hpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pdgate {

// The /tokenize body for a request: its model (raw JSON, when given) and
// its prompt (completions) or messages (chat, with the generation prompt
// the engine would add), as vLLM's tokenize endpoint takes them.
std::string tokenize_body(bool chat, std::optional<std::string_view> model_raw,
                          std::string_view prompt_raw);

// The ids of a /tokenize answer ({"count", "max_model_len", "tokens"}), or
// nothing when it is not one (a token that is not a 32-bit id included).
std::optional<std::vector<std::uint32_t>> parse_tokenize_answer(std::string_view answer);

}  // namespace pdgate
