// The start line and header fields of an HTTP/1.x message, rendered the
// way Beast's serializer writes them (fields in order, then the empty
// line), so that a message with a string body can go out as one gather
// write of head and body: for the small messages most requests are made
// of, Beast's generic serializer costs more CPU than the rest of sending
// them.
#pragma once

#include <string>

#include <boost/beast/http/message.hpp>

namespace pdgate {

std::string render_head(const boost::beast::http::response_header<>& res);
std::string render_head(const boost::beast::http::request_header<>& req);

// Whether render_head() + body is the whole message: HTTP/1.0 or 1.1, not
// chunked (chunked bodies need Beast's framing).
template <bool isRequest, class Body>
bool head_renders_message(const boost::beast::http::message<isRequest, Body>& m) {
  return !m.chunked() && (m.version() == 10 || m.version() == 11);
}

}  // namespace pdgate
