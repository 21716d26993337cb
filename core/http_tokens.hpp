// The character classes of HTTP's grammar (RFC 9110 5.6) that the
// gateway's own header checks use: tokens, field-value characters,
// optional whitespace. One table lookup per byte.
#pragma once

#include <array>
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
// where SSE2 is there: an engine's header is mostly field values.
inline const char* skip_value_chars(const char* p, const char* end) {
#if defined(__SSE2__)
  const __m128i below_space = _mm_set1_epi8(0x1f);
  const __m128i tab = _mm_set1_epi8('\t');
  const __m128i del = _mm_set1_epi8(0x7f);
  while (end - p >= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // Unsigned v <= 0x1f exactly where min(v, 0x1f) == v.
    const __m128i control =
        _mm_andnot_si128(_mm_cmpeq_epi8(v, tab), _mm_cmpeq_epi8(_mm_min_epu8(v, below_space), v));
    const auto stop =
        static_cast<unsigned>(_mm_movemask_epi8(_mm_or_si128(control, _mm_cmpeq_epi8(v, del))));
    if (stop != 0)
      return p + __builtin_ctz(stop);
    p += 16;
  }
#endif
  while (p != end && is_value_char(*p))
    ++p;
  return p;
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

}  // namespace pdgate::http_tokens
