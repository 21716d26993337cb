// Writing a whole response to a client connection.
#pragma once

#include <optional>
#include <string_view>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http.hpp>
#include "core/net/maybe_tls_stream.hpp"

namespace pdgate {

// Writes `res` (head and body in one gathering write when it can); returns
// false if the client is gone or stopped reading for 60 s.
boost::asio::awaitable<bool> write_response(
    MaybeTlsStream& client, boost::beast::http::response<boost::beast::http::string_body>& res);

// Writes an already rendered head (status line, fields, empty line) and
// its body in one gathering write, bounded as write_response is. Not a
// coroutine: what the socket takes at once costs no frame; the rest, if
// any, is written by the returned awaitable (head and body must outlive
// it), as MaybeTlsStream::write does. `ec` tells a failure.
//
//   beast::error_code ec;
//   if (auto rest = write_head_and_body(client, head, body, ec))
//     ec = co_await std::move(*rest);
std::optional<boost::asio::awaitable<boost::beast::error_code>> write_head_and_body(
    MaybeTlsStream& client, std::string_view head, std::string_view body,
    boost::beast::error_code& ec);

}  // namespace pdgate
