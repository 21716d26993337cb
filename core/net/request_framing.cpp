#include "core/net/request_framing.hpp"

#include <string_view>
#include <vector>

#include <boost/beast/core/string.hpp>

#include "core/base/http_tokens.hpp"

namespace pdgate {

namespace http = boost::beast::http;

namespace {

using http_tokens::is_tchar;
using http_tokens::trim_ows;

}  // namespace

std::optional<GatewayError> check_request_framing(const http::request_header<>& h) {
  // Every Transfer-Encoding field, in order, as one list of codings.
  std::vector<std::string_view> codings;
  bool present = false;
  for (const auto& f : h) {
    if (f.name() != http::field::transfer_encoding)
      continue;
    present = true;
    std::string_view v = f.value();
    while (true) {
      const auto comma = v.find(',');
      const auto item = trim_ows(v.substr(0, comma));
      // Empty list elements are allowed and ignored (RFC 9110 5.6.1).
      if (!item.empty())
        codings.push_back(item);
      if (comma == std::string_view::npos)
        break;
      v.remove_prefix(comma + 1);
    }
  }
  if (!present)
    return std::nullopt;
  auto refuse = [](ErrorKind kind, std::string why) {
    return client_error(kind, "Transfer-Encoding refused: " + std::move(why));
  };
  if (h.version() < 11)
    return refuse(ErrorKind::bad_request, "an HTTP/1.0 request cannot use it");
  if (h.find(http::field::content_length) != h.end())
    return refuse(ErrorKind::bad_request, "sent together with Content-Length");
  if (codings.empty())
    return refuse(ErrorKind::bad_request, "the header is empty");
  for (const auto c : codings) {
    for (const char ch : c) {
      // Parameters (";q=...") are not part of any coding a request uses.
      if (!is_tchar(ch))
        return refuse(ErrorKind::bad_request, "'" + std::string(c) + "' is not a transfer coding");
    }
  }
  if (!boost::beast::iequals(codings.back(), "chunked"))
    return refuse(ErrorKind::bad_request,
                  "the final coding must be chunked, got '" + std::string(codings.back()) + "'");
  for (std::size_t i = 0; i + 1 < codings.size(); ++i) {
    if (boost::beast::iequals(codings[i], "chunked"))
      return refuse(ErrorKind::bad_request, "chunked is applied more than once");
    return refuse(ErrorKind::not_implemented,
                  "the coding '" + std::string(codings[i]) + "' is not supported");
  }
  return std::nullopt;
}

std::optional<GatewayError> check_header_lines(std::string_view raw_header) {
  for (std::size_t at = raw_header.find("\r\n"); at != std::string_view::npos;
       at = raw_header.find("\r\n", at + 2)) {
    if (at + 2 < raw_header.size() && (raw_header[at + 2] == ' ' || raw_header[at + 2] == '\t'))
      return client_error(ErrorKind::bad_request,
                          "a header line is folded onto the next (obs-fold), which is refused");
  }
  return std::nullopt;
}

std::optional<GatewayError> check_host_field(const http::request_header<>& h) {
  if (h.version() < 11)
    return std::nullopt;
  if (h.count(http::field::host) != 1)
    return client_error(ErrorKind::bad_request,
                        "an HTTP/1.1 request must have exactly one Host header");
  return std::nullopt;
}

}  // namespace pdgate
