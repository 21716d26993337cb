// The character classes of HTTP's grammar (RFC 9110 5.6) that the
// gateway's own header checks use: tokens, field-value characters,
// optional whitespace. One table lookup per byte.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pdgate::http_tokens {

inline constexpr unsigned char kToken = 1;  // tchar: field names, list items
inline constexpr unsigned char kValue = 2;  // VCHAR, obs-text, SP, HTAB

inline constexpr std::array<unsigned char, 256> kClasses = [] {
  std::array<unsigned char, 256> t{};
  for (int c = 0; c < 256; ++c) {
    if (c == '\t' || (c >= 0x20 && c != 0x7f))
      t[static_cast<std::size_t>(c)] |= kValue;
  }
  for (const char c : std::string_view("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    t[static_cast<unsigned char>(c)] |= kToken;
  return t;
}();

constexpr bool is_tchar(char c) {
  return (kClasses[static_cast<unsigned char>(c)] & kToken) != 0;
}

constexpr bool is_value_char(char c) {
  return (kClasses[static_cast<unsigned char>(c)] & kValue) != 0;
}

// The first byte from `p` on that is no field-value character (a control
// character other than HTAB, or DEL), or `end`. Sixteen bytes at a time
// where SSE2 is there: an engine's header is mostly field values. With
// `kObsText` false, bytes from 0x80 up stop it too (printable ASCII, SP
// and HTAB only).
template <bool kObsText = true>
inline const char* skip_value_chars(const char* p, const char* end) {
#if defined(__SSE2__)
  const __m128i tab = _mm_set1_epi8('\t');
  const __m128i del = _mm_set1_epi8(0x7f);
  while (end - p >= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    __m128i control;
    if constexpr (kObsText) {
      // Unsigned v <= 0x1f exactly where min(v, 0x1f) == v.
      const __m128i below_space = _mm_set1_epi8(0x1f);
      control = _mm_cmpeq_epi8(_mm_min_epu8(v, below_space), v);
    } else {
      // Signed, bytes from 0x80 up are negative: below SP with the controls.
      control = _mm_cmplt_epi8(v, _mm_set1_epi8(0x20));
    }
    control = _mm_andnot_si128(_mm_cmpeq_epi8(v, tab), control);
    const auto stop =
        static_cast<unsigned>(_mm_movemask_epi8(_mm_or_si128(control, _mm_cmpeq_epi8(v, del))));
    if (stop != 0)
      return p + __builtin_ctz(stop);
    p += 16;
  }
#endif
  while (p != end && is_value_char(*p) && (kObsText || static_cast<unsigned char>(*p) < 0x80))
    ++p;
  return p;
}

// Reads one header or trailer field line starting at `p`, before `end`,
// in one pass: `token ":" OWS value OWS CRLF`, the value of value
// characters only (see skip_value_chars for `kObsText`). Returns where
// the next line starts, or nullptr if the line is malformed (a bare CR or
// LF, an obs-fold, a name that is no token, a control character).
template <bool kObsText = true>
inline const char* read_field_line(const char* p, const char* end, std::string_view& name,
                                   std::string_view& value) {
  const char* const name_begin = p;
  while (p != end && is_tchar(*p))
    ++p;
  if (p == name_begin || p == end || *p != ':')
    return nullptr;
  name = std::string_view(name_begin, static_cast<std::size_t>(p - name_begin));
  ++p;
  while (p != end && (*p == ' ' || *p == '\t'))
    ++p;
  const char* const value_begin = p;
  p = skip_value_chars<kObsText>(p, end);
  const char* value_end = p;
  while (value_end != value_begin && (value_end[-1] == ' ' || value_end[-1] == '\t'))
    --value_end;
  if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
    return nullptr;
  value = std::string_view(value_begin, static_cast<std::size_t>(value_end - value_begin));
  return p + 2;
}

constexpr bool is_token(std::string_view s) {
  if (s.empty())
    return false;
  for (const char c : s) {
    if (!is_tchar(c))
      return false;
  }
  return true;
}

// `s` without the spaces and tabs around it (OWS).
constexpr std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

// Calls `f(item)` for each item of a comma-separated list (empty items,
// as "a,,b" has, are skipped, as RFC 9110 5.6.1 asks); false if an item
// is not a token.
template <class F>
bool for_each_token(std::string_view list, F&& f) {
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    const std::string_view item = trim_ows(list.substr(0, comma));
    if (!item.empty()) {
      if (!is_token(item))
        return false;
      f(item);
    }
    if (comma == std::string_view::npos)
      break;
    list.remove_prefix(comma + 1);
  }
  return true;
}

// A Content-Length value as one decimal number of 1 to 19 digits (so it
// cannot overflow); nullopt for anything else, a list ("5, 5") included.
constexpr std::optional<std::uint64_t> decimal_length(std::string_view v) {
  if (v.empty() || v.size() > 19)
    return std::nullopt;
  std::uint64_t n = 0;
  for (const char c : v) {
    if (c < '0' || c > '9')
      return std::nullopt;
    n = n * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return n;
}

}  // namespace pdgate::http_tokens
