// How a client request's body is framed, judged from its header before any
// of the body is read (RFC 9112 section 6). A gateway that frames a body
// differently from the client, or from a proxy in front of it, serves the
// body's bytes as a request of their own: request smuggling. So anything
// but a Content-Length or a single, final "chunked" coding is refused and
// the connection closed. And the two header rules a request's reading
// depends on: no folded lines, and one Host in HTTP/1.1.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/http/message.hpp>

#include "core/net/errors.hpp"

namespace pdgate {

// Nullopt when the request may be read: no Transfer-Encoding (Beast has
// already checked Content-Length), or exactly "chunked" (any letter case,
// optional whitespace) in an HTTP/1.1 request without Content-Length.
// Else bad_request, or not_implemented for a coding pdgate does not
// decode.
std::optional<GatewayError> check_request_framing(const boost::beast::http::request_header<>& h);

// The raw header (request line to the empty line): refused when a field
// line is continued on the next (obs-fold: a line that starts with a space
// or tab), which RFC 9112 5.2 lets a server refuse and which proxies in
// front may unfold differently. Beast's parser accepts it, so it is looked
// for in the bytes before Beast reads them.
std::optional<GatewayError> check_header_lines(std::string_view raw_header);

// An HTTP/1.1 request must carry exactly one Host field (RFC 9112 3.2):
// else bad_request. HTTP/1.0 requests may omit it.
std::optional<GatewayError> check_host_field(const boost::beast::http::request_header<>& h);

}  // namespace pdgate
