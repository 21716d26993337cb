// The character classes of HTTP's grammar (RFC 9110 5.6) that the
// gateway's own header checks use: tokens, field-value characters,
// optional whitespace. One table lookup per byte.
#pragma once

#include <array>
#include <string_view>

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
