#include "plugins/sim_tokenizer.hpp"

#include <nlohmann/json.hpp>

#include "sim/tokenizer.hpp"

namespace pdgate {

std::optional<std::vector<std::uint32_t>> SimTokenizer::token_ids(
    bool chat, std::string_view prompt_raw) const {
  if (prompt_raw.empty())
    return std::nullopt;
  // The sim's rules read a whole body; only the prompt part matters.
  nlohmann::json body = nlohmann::json::object();
  auto part = nlohmann::json::parse(prompt_raw, nullptr, false);
  if (part.is_discarded())
    return std::nullopt;
  body[chat ? "messages" : "prompt"] = std::move(part);
  const auto p = chat ? sim::chat_prompt(body) : sim::completion_prompt(body);
  if (!p.ok())
    return std::nullopt;
  return sim::token_ids(p.prompt.text);
}

}  // namespace pdgate
