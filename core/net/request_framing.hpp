// How a client request's body is framed, judged from its header before any
// of the body is read (RFC 9112 section 6). A gateway that frames a body
// differently from the client, or from a proxy in front of it, serves the
// body's bytes as a request of their own: request smuggling. So anything
// but a Content-Length or a single, final "chunked" coding is refused and
// the connection closed.
#pragma once

#include <optional>
#include <string>

#include <boost/beast/http/message.hpp>

#include "core/net/errors.hpp"

namespace pdgate {

// Nullopt when the request may be read: no Transfer-Encoding (Beast has
// already checked Content-Length), or exactly "chunked" (any letter case,
// optional whitespace) in an HTTP/1.1 request without Content-Length.
// Else bad_request, or not_implemented for a coding pdgate does not
// decode.
std::optional<GatewayError> check_request_framing(const boost::beast::http::request_header<>& h);

}  // namespace pdgate
