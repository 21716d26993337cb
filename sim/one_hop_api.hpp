// vLLM's endpoints one engine answers alone, as the sim answers them:
// small, deterministic answers in vLLM's shapes (detokenize inverts the
// sim's token ids; embeddings and pooling are vectors of kEmbeddingDim
// numbers hashed from the text; scores are hashed from the pair), so a
// test can predict each one. Shapes checked against vLLM's
// vllm/entrypoints/pooling/{embed,pooling,classify,scoring}/protocol.py,
// vllm/entrypoints/serve/tokenize/protocol.py and
// vllm/entrypoints/openai/speech_to_text/protocol.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pdgate::sim {

inline constexpr std::size_t kEmbeddingDim = 8;

struct OneHopAnswer {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

// Whether the sim answers `path` here (every method but POST gets 405).
bool is_one_hop_path(std::string_view path);

// Answers a POST to `path` with `body` (its Content-Type `content_type`)
// for an engine serving `model`; `rid` names the answer.
OneHopAnswer answer_one_hop(std::string_view path, std::string_view content_type,
                            const std::string& body, const std::string& model,
                            const std::string& rid, std::int64_t created);

// The prefix text of token ids (the inverse of token_ids(), trailing zero
// padding dropped).
std::string detokenize_ids(const std::vector<std::uint32_t>& ids);

}  // namespace pdgate::sim
