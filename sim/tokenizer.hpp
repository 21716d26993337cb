// The sim's deterministic stand-in for a tokenizer. A prompt becomes a byte
// string (its "prefix text"); its token count is ceil(bytes / 4). The same
// bytes feed the prefix cache, so two requests share cached tokens exactly
// when their prefix texts share leading 4*block_size-byte blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace pdgate::sim {

inline constexpr std::size_t kBytesPerToken = 4;
// Every image_url / audio_url / input_audio part costs this many tokens.
inline constexpr std::size_t kMediaTokens = 64;

// FNV-1a, 64 bit: stable across processes and builds, so prefix hashes and
// media hashes agree between a prefill and a decode sim.
std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t basis = 14695981039346656037ull);

inline std::size_t tokens_for_bytes(std::size_t bytes) {
  return (bytes + kBytesPerToken - 1) / kBytesPerToken;
}

struct Prompt {
  std::string text;  // the prefix text; tokens == tokens_for_bytes(text.size())
  std::size_t tokens = 0;
  std::size_t text_items = 0;   // chat: string contents and `text` parts
  std::size_t media_items = 0;  // chat: image_url / audio_url / input_audio parts
};

struct PromptResult {
  Prompt prompt;
  std::string error;  // non-empty: the request is malformed (answer 400)
  bool ok() const { return error.empty(); }
};

// The integer ids of a prefix text's tokens: token i is the little-endian
// uint32 of bytes [4i, 4i+4), the last one zero-padded. Ids are a bijection
// of the bytes (up to trailing zero padding), so a gateway that applies the
// same prompt rules computes the same ids an engine reports in its KV events,
// and a token-id prompt's ids come back unchanged.
std::vector<std::uint32_t> token_ids(std::string_view prefix_text);

// /v1/completions: `prompt` is a string, a list of strings (the first is
// used), a list of token ids (count = length; each id contributes 4 bytes),
// or a list of such lists (the first is used).
PromptResult completion_prompt(const nlohmann::json& body);

// /v1/chat/completions: concatenation of every message's role and text
// content; each media part contributes kMediaTokens*4 bytes derived from a
// hash of its bytes (URL or data), so identical media share a prefix.
PromptResult chat_prompt(const nlohmann::json& body);

// Encoder instances accept one shape only (what a proxy's E stage sends):
// a chat request whose messages hold exactly one image_url / audio_url /
// input_audio part and no text, max_tokens (or max_completion_tokens) 1, and
// no streaming. Returns the broken rule, or "" when the request conforms.
std::string encoder_violation(const nlohmann::json& body, bool chat);

// The i-th output token's text (" word"): a fixed word list indexed by
// position, so outputs are predictable in tests.
std::string output_token(std::size_t i);
std::string output_text(std::size_t n);

// How many output tokens `text` already ends with: the largest k such that
// `text` ends with output_text(k) (0 when none). A continuation (a chat's
// partial assistant message with continue_final_message, a completion
// whose prompt was extended by the answer so far) goes on from token k, so
// an answer resumed elsewhere equals the uninterrupted one token by token.
std::size_t continuation_offset(std::string_view text);

// The i-th output token's id, as vLLM's return_token_ids reports it:
// 0xFFFF0000 + i mod 16, outside the ids a prompt's bytes make (their top
// byte would be 0xFF, which no UTF-8 text holds), so a token-id prompt's
// trailing output ids are told from its prompt ids.
std::uint32_t output_token_id(std::size_t i);
// continuation_offset() for a token-id prompt: how many output tokens its
// ids end with (the longest run of output ids that starts at token 0).
std::size_t continuation_offset(const std::vector<std::uint32_t>& ids);

}  // namespace pdgate::sim
