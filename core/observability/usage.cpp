#include "core/observability/usage.hpp"

#include <charconv>
#include <cstring>

#include "core/base/json_body.hpp"
#include "core/base/json_edit.hpp"

namespace pdgate {

namespace {

constexpr std::string_view kKey = "\"usage\"";
// A usage object is a few counters and details: past this, it is not one.
constexpr std::size_t kMaxUsageBytes = 4096;

// The first index from `i` that is not JSON whitespace, or `limit`.
std::size_t skip_blanks(std::string_view s, std::size_t i, std::size_t limit) {
  while (i < limit && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
    ++i;
  return i;
}

// Where the last `"usage"` key starts, or npos. Its 'g' is searched from
// the end (memrchr): the counts after the key (prompt_tokens, total_tokens,
// completion_tokens, prompt_tokens_details) hold none, so the first 'g'
// found is usually the key's. rfind compared the key at every position.
std::size_t find_last_key(std::string_view text) {
  constexpr std::size_t kG = 4;  // the 'g' in "usage", quote included
  std::size_t n = text.size();
  while (n > kG) {
    const void* g = ::memrchr(text.data() + kG, 'g', n - kG);
    if (g == nullptr)
      return std::string_view::npos;
    const std::size_t at = static_cast<std::size_t>(static_cast<const char*>(g) - text.data());
    if (text.substr(at - kG, kKey.size()) == kKey)
      return at - kG;
    n = at;
  }
  return std::string_view::npos;
}

// The end of the string whose opening quote is at `open`: the index of its
// closing quote (one not escaped by an odd run of backslashes) before
// `limit`, or npos.
std::size_t string_end(std::string_view s, std::size_t open, std::size_t limit) {
  std::size_t j = open + 1;
  while (j < limit) {
    const void* q = std::memchr(s.data() + j, '"', limit - j);
    if (q == nullptr)
      return std::string_view::npos;
    j = static_cast<std::size_t>(static_cast<const char*>(q) - s.data());
    std::size_t b = j;
    while (b > open + 1 && s[b - 1] == '\\')
      --b;
    if ((j - b) % 2 == 0)
      return j;
    ++j;
  }
  return std::string_view::npos;
}

// The usage object starting at `open` (its '{'), read in one pass: its own
// members' counts (nested objects such as prompt_tokens_details skipped)
// and its closing brace. nullopt when it is cut off, longer than
// kMaxUsageBytes, or lacks either count. Read in place: a DOM parse of
// these few bytes cost ~9,000 instructions and a dozen allocations per
// answer, and finding the end first and reading the counts after cost
// twice the scan. A count is a plain unsigned integer; anything else
// (negative, a fraction, an exponent, out of range) leaves it unread, as a
// missing one.
std::optional<TokenUsage> read_usage(std::string_view s, std::size_t open, bool in_events) {
  std::size_t limit = std::min(s.size(), open + kMaxUsageBytes);
  // In events a data line never holds a line break: the object must close
  // before the first one (and must not be completed by what follows the
  // events).
  if (in_events) {
    for (const char brk : {'\n', '\r'}) {
      if (const void* p = std::memchr(s.data() + open, brk, limit - open))
        limit = static_cast<std::size_t>(static_cast<const char*>(p) - s.data());
    }
  }
  std::optional<std::uint64_t> prompt;
  std::optional<std::uint64_t> completion;
  int depth = 0;
  std::size_t i = open;
  while (i < limit) {
    const char c = s[i];
    if (c == '{' || c == '[') {
      ++depth;
      ++i;
      continue;
    }
    if (c == '}' || c == ']') {
      if (--depth > 0) {
        ++i;
        continue;
      }
      if (c != '}' || !prompt || !completion)
        return std::nullopt;
      return TokenUsage{*prompt, *completion};
    }
    if (c != '"') {
      ++i;
      continue;
    }
    const std::size_t j = string_end(s, i, limit);
    if (j == std::string_view::npos)
      return std::nullopt;
    const std::string_view name = s.substr(i + 1, j - i - 1);
    i = j + 1;
    if (depth != 1)
      continue;
    // The Responses API names them input_tokens and output_tokens.
    std::optional<std::uint64_t>* slot = name == "prompt_tokens" || name == "input_tokens" ? &prompt
                                         : name == "completion_tokens" || name == "output_tokens"
                                             ? &completion
                                             : nullptr;
    if (slot == nullptr)
      continue;  // another member, or a string value: scanned on
    std::size_t k = skip_blanks(s, i, limit);
    if (k >= limit || s[k] != ':')
      continue;  // a string value, not a member's name
    k = skip_blanks(s, k + 1, limit);
    i = k;
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data() + k, s.data() + limit, v);
    const std::size_t next = skip_blanks(s, static_cast<std::size_t>(end - s.data()), limit);
    if (ec == std::errc() && next < limit && (s[next] == ',' || s[next] == '}'))
      *slot = v;
    else
      *slot = std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

std::optional<TokenUsage> last_usage(std::string_view text, bool in_events) {
  const std::size_t key = find_last_key(text);
  if (key == std::string_view::npos)
    return std::nullopt;
  std::size_t i = skip_blanks(text, key + kKey.size(), text.size());
  if (i >= text.size() || text[i] != ':')
    return std::nullopt;
  i = skip_blanks(text, i + 1, text.size());
  if (i >= text.size() || text[i] != '{')
    return std::nullopt;
  return read_usage(text, i, in_events);
}

namespace {

// A whole answer's (or an event's) top-level usage object, indexed.
struct UsageObject {
  JsonObjectIndex top;
  std::string_view usage;
  JsonObjectIndex index;
  std::optional<std::string_view> details;  // prompt_tokens_details, raw
};

std::optional<UsageObject> usage_object(std::string_view text) {
  auto top = index_json_object(text);
  if (!top)
    return std::nullopt;
  const auto usage = raw_member(text, *top, "usage");
  if (!usage || usage->empty() || usage->front() != '{')
    return std::nullopt;
  auto index = index_json_object(*usage);
  if (!index)
    return std::nullopt;
  UsageObject u{std::move(*top), *usage, std::move(*index), std::nullopt};
  u.details = raw_member(u.usage, u.index, "prompt_tokens_details");
  return u;
}

}  // namespace

std::optional<std::uint64_t> prompt_cached_tokens(std::string_view answer) {
  const auto u = usage_object(answer);
  if (!u)
    return std::nullopt;
  // vLLM leaves the details out (null) when nothing was cached.
  if (!u->details || *u->details == "null")
    return 0;
  const std::string_view details = *u->details;
  if (details.empty() || details.front() != '{')
    return std::nullopt;
  const auto d = index_json_object(details);
  const auto cached = d ? raw_member(details, *d, "cached_tokens") : std::nullopt;
  if (!cached)
    return std::nullopt;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(cached->data(), cached->data() + cached->size(), v);
  if (ec != std::errc() || end != cached->data() + cached->size())
    return std::nullopt;
  return v;
}

std::optional<std::string> with_cached_tokens(std::string_view object, std::uint64_t cached) {
  const auto u = usage_object(object);
  // Only an engine that reports details (--enable-prompt-tokens-details)
  // gets prefill's count in place of its own.
  if (!u || !u->details || *u->details == "null")
    return std::nullopt;
  JsonBodyEditor usage_edit(u->usage, u->index);
  usage_edit.set("prompt_tokens_details", R"({"cached_tokens":)" + std::to_string(cached) + "}");
  JsonBodyEditor e(object, u->top);
  e.set("usage", usage_edit.render());
  return e.render();
}

}  // namespace pdgate
