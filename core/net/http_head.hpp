// HTTP/1.x heads written as text. A Beast message's head is rendered the
// way Beast's serializer writes it (fields in order, then the empty line),
// so that a message with a string body can go out as one gather write of
// head and body: for the small messages most answers are, Beast's generic
// serializer costs more CPU than the rest of sending them. Heads that never
// were Beast messages (each stage's engine request, core/pipeline/engine_call.cpp; the
// relayed answer, core/pipeline/relay.cpp) are put together by assemble_head.
#pragma once

#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/http/message.hpp>

namespace pdgate {

// The value of the first field called `name`, or nullopt. A pass over the
// few fields a request has, comparing the enum Beast stored for each: its
// find() walks an ordered set comparing names letter by letter without
// case, ~550 instructions for Content-Type on every request.
inline std::optional<std::string_view> first_field(const boost::beast::http::fields& fields,
                                                   boost::beast::http::field name) {
  for (const auto& f : fields) {
    if (f.name() == name)
      return std::string_view(f.value());
  }
  return std::nullopt;
}

// The path of a request target: what routes match on, without the query.
inline std::string_view path_of(std::string_view target) {
  return target.substr(0, target.find('?'));
}

std::string render_head(const boost::beast::http::response_header<>& res);

// A head assembled from pieces: `build(put)` calls put(std::string_view)
// for each piece in order, and is run twice, once to measure and once to
// copy. One allocation, and a plain copy per piece rather than an append
// that checks the capacity: the gateway writes a head for every stage of
// every request and for every answer.
template <class Build>
std::string assemble_head(Build&& build) {
  std::size_t size = 0;
  build([&size](std::string_view piece) { size += piece.size(); });
  std::string out(size, '\0');
  char* p = out.data();
  build([&p](std::string_view piece) {
    std::memcpy(p, piece.data(), piece.size());
    p += piece.size();
  });
  return out;
}

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
