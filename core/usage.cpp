#include "core/usage.hpp"

#include <nlohmann/json.hpp>

namespace pdgate {

namespace {

constexpr std::string_view kKey = "\"usage\"";
// A usage object is a few counters and details: past this, it is not one.
constexpr std::size_t kMaxUsageBytes = 4096;

std::size_t skip_blanks(std::string_view s, std::size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
    ++i;
  return i;
}

// The end (one past the closing brace) of the object starting at `open`,
// strings skipped; npos when it is cut off or too long.
std::size_t object_end(std::string_view s, std::size_t open, bool in_events) {
  int depth = 0;
  bool in_string = false;
  const std::size_t limit = std::min(s.size(), open + kMaxUsageBytes);
  for (std::size_t i = open; i < limit; ++i) {
    const char c = s[i];
    if (in_events && (c == '\n' || c == '\r'))
      return std::string_view::npos;
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

std::optional<std::uint64_t> count(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned())
    return std::nullopt;
  return it->get<std::uint64_t>();
}

}  // namespace

std::optional<TokenUsage> last_usage(std::string_view text, bool in_events) {
  const std::size_t key = text.rfind(kKey);
  if (key == std::string_view::npos)
    return std::nullopt;
  std::size_t i = skip_blanks(text, key + kKey.size());
  if (i >= text.size() || text[i] != ':')
    return std::nullopt;
  i = skip_blanks(text, i + 1);
  if (i >= text.size() || text[i] != '{')
    return std::nullopt;
  const std::size_t end = object_end(text, i, in_events);
  if (end == std::string_view::npos)
    return std::nullopt;
  const auto j = nlohmann::json::parse(text.substr(i, end - i), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return std::nullopt;
  const auto prompt = count(j, "prompt_tokens");
  const auto completion = count(j, "completion_tokens");
  if (!prompt || !completion)
    return std::nullopt;
  return TokenUsage{*prompt, *completion};
}

}  // namespace pdgate
