#include "core/usage.hpp"

#include <charconv>

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

// The counts among the usage object's own members (nested objects such
// as prompt_tokens_details skipped), read in place: a DOM parse of these
// few bytes cost ~9,000 instructions and a dozen allocations per answer.
// A count is a plain unsigned integer; anything else (negative, a
// fraction, an exponent, out of range) leaves it unread, as a missing one.
std::optional<TokenUsage> read_counts(std::string_view o) {
  std::optional<std::uint64_t> prompt;
  std::optional<std::uint64_t> completion;
  int depth = 0;
  std::size_t i = 0;
  while (i < o.size()) {
    const char c = o[i];
    if (c != '"') {
      if (c == '{' || c == '[')
        ++depth;
      else if (c == '}' || c == ']')
        --depth;
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    while (j < o.size() && o[j] != '"')
      j += o[j] == '\\' ? 2 : 1;
    if (j >= o.size())
      return std::nullopt;
    const std::string_view name = o.substr(i + 1, j - i - 1);
    i = j + 1;
    if (depth != 1)
      continue;
    std::size_t k = skip_blanks(o, i);
    if (k >= o.size() || o[k] != ':')
      continue;  // a string value, not a member's name
    k = skip_blanks(o, k + 1);
    i = k;
    std::optional<std::uint64_t>* slot = name == "prompt_tokens"       ? &prompt
                                         : name == "completion_tokens" ? &completion
                                                                       : nullptr;
    if (slot == nullptr)
      continue;
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(o.data() + k, o.data() + o.size(), v);
    const std::size_t after = static_cast<std::size_t>(end - o.data());
    const std::size_t next = skip_blanks(o, after);
    if (ec == std::errc() && next < o.size() && (o[next] == ',' || o[next] == '}'))
      *slot = v;
    else
      *slot = std::nullopt;
  }
  if (!prompt || !completion)
    return std::nullopt;
  return TokenUsage{*prompt, *completion};
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
  return read_counts(text.substr(i, end - i));
}

}  // namespace pdgate
