// The status line and header fields of an HTTP/1.x response, rendered the
// way Beast's serializer writes them (fields in order, then the empty
// line), so that an answer with a string body can go out as one gather
// write of head and body: for the small messages most answers are, Beast's
// generic serializer costs more CPU than the rest of sending them.
// (Upstream requests are gathered from Beast's own fields writer instead:
// core/upstream.cpp.)
#pragma once

#include <string>
#include <string_view>

#include <boost/beast/http/message.hpp>

namespace pdgate {

// The path of a request target: what routes match on, without the query.
inline std::string_view path_of(std::string_view target) {
  return target.substr(0, target.find('?'));
}

std::string render_head(const boost::beast::http::response_header<>& res);

// The request line and header fields of an HTTP/1.1 request, as Beast
// writes them, then the empty line.
std::string render_request_head(const boost::beast::http::request_header<>& req);

// Whether render_head() + body is the whole message: HTTP/1.0 or 1.1, not
// chunked (chunked bodies need Beast's framing).
template <bool isRequest, class Body>
bool head_renders_message(const boost::beast::http::message<isRequest, Body>& m) {
  return !m.chunked() && (m.version() == 10 || m.version() == 11);
}

}  // namespace pdgate
