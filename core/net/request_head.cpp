#include "core/net/request_head.hpp"

#include <array>

#include <boost/beast/http/field.hpp>
#include <boost/beast/http/verb.hpp>

#include "core/base/http_tokens.hpp"

namespace pdgate {

namespace {

namespace http = boost::beast::http;
using http_tokens::is_tchar;

// More fields than this and Beast reads the header (no request pdgate
// serves needs half as many; the bound keeps the field list on the stack).
constexpr std::size_t kMaxPlainFields = 64;

// (No member initializers: the list is not zeroed for every request.)
struct FieldView {
  http::field name;
  std::string_view name_string;
  std::string_view value;
};

// Printable ASCII: what a plain request target holds.
constexpr bool is_visible(char c) {
  return c > 0x20 && c < 0x7f;
}

}  // namespace

std::optional<PlainRequestHead> parse_plain_request_head(std::string_view bytes,
                                                         const RequestHeadLimits& limits,
                                                         http::request<http::string_body>& req) {
  const std::size_t end = bytes.find("\r\n\r\n");
  if (end == std::string_view::npos)
    return std::nullopt;
  const std::size_t header_size = end + 4;
  if (header_size >= limits.header_bytes)
    return std::nullopt;
  const char* p = bytes.data();
  const char* const last = p + end + 2;  // after the last field's CRLF

  // request-line = method SP request-target SP HTTP-version CRLF
  const char* const method_begin = p;
  while (is_tchar(*p))
    ++p;
  if (p == method_begin || *p != ' ')
    return std::nullopt;
  const std::string_view method(method_begin, static_cast<std::size_t>(p - method_begin));
  const http::verb verb = http::string_to_verb(method);
  if (verb == http::verb::unknown)
    return std::nullopt;
  const char* const target_begin = ++p;
  while (is_visible(*p))
    ++p;
  if (p == target_begin || *p != ' ')
    return std::nullopt;
  const std::string_view target(target_begin, static_cast<std::size_t>(p - target_begin));
  ++p;
  if (last - p < 10 || std::string_view(p, 7) != "HTTP/1." || (p[7] != '0' && p[7] != '1') ||
      p[8] != '\r' || p[9] != '\n')
    return std::nullopt;
  const unsigned version = p[7] == '1' ? 11 : 10;
  p += 10;

  // field-line = field-name ":" OWS field-value OWS CRLF, every byte of
  // the value printable ASCII or inner SP / HTAB.
  std::array<FieldView, kMaxPlainFields> fields;
  std::size_t count = 0;
  std::optional<std::uint64_t> length;
  while (p != last) {
    if (count == kMaxPlainFields)
      return std::nullopt;
    // A value byte outside printable ASCII, or a CRLF followed by SP or
    // HTAB (obs-fold: the next line then starts with no token), and the
    // header goes to Beast.
    FieldView& f = fields[count++];
    p = http_tokens::read_field_line<false>(p, last, f.name_string, f.value);
    if (p == nullptr)
      return std::nullopt;
    f.name = http::string_to_field(f.name_string);
    switch (f.name) {
      case http::field::content_length:
        // A repeat or a list ("5, 5") goes to Beast, which compares the
        // values.
        if (length)
          return std::nullopt;
        length = http_tokens::decimal_length(f.value);
        if (!length || *length > limits.body_bytes)
          return std::nullopt;
        break;
      case http::field::connection:
      case http::field::proxy_connection:
        // Tokens, empty items allowed (as Beast allows them).
        if (!http_tokens::for_each_token(f.value, [](std::string_view) {}))
          return std::nullopt;
        break;
      case http::field::transfer_encoding:
      case http::field::upgrade:
        return std::nullopt;
      default:
        break;
    }
  }

  req.method(verb);
  req.target(target);
  req.version(version);
  for (std::size_t i = 0; i < count; ++i)
    req.insert(fields[i].name, fields[i].name_string, fields[i].value);
  return PlainRequestHead{header_size, length.value_or(0)};
}

}  // namespace pdgate
