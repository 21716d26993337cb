#include "core/routing/tokenize_message.hpp"

#include <nlohmann/json.hpp>

namespace pdgate {

std::string tokenize_body(bool chat, std::optional<std::string_view> model_raw,
                          std::string_view prompt_raw) {
  std::string body = "{";
  if (model_raw) {
    body += "\"model\":";
    body += *model_raw;
    body += ',';
  }
  body += chat ? "\"messages\":" : "\"prompt\":";
  body += prompt_raw;
  if (chat)
    body += ",\"add_generation_prompt\":true";
  body += '}';
  return body;
}

std::optional<std::vector<std::uint32_t>> parse_tokenize_answer(std::string_view answer) {
  const auto j = nlohmann::json::parse(answer, nullptr, false);
  if (!j.is_object())
    return std::nullopt;
  const auto it = j.find("tokens");
  if (it == j.end() || !it->is_array())
    return std::nullopt;
  std::vector<std::uint32_t> ids;
  ids.reserve(it->size());
  for (const auto& t : *it) {
    if (!t.is_number_unsigned() || t.get<std::uint64_t>() > 0xffffffffu)
      return std::nullopt;
    ids.push_back(static_cast<std::uint32_t>(t.get<std::uint64_t>()));
  }
  return ids;
}

}  // namespace pdgate
