// Writing a whole response to a client connection.
#pragma once

#include <string_view>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http.hpp>
#include "core/maybe_tls_stream.hpp"

namespace pdgate {

// Writes `res` (head and body in one gathering write when it can); returns
// false if the client is gone or stopped reading for 60 s.
boost::asio::awaitable<bool> write_response(
    MaybeTlsStream& client, boost::beast::http::response<boost::beast::http::string_body>& res);

// Writes an already rendered head (status line, fields, empty line) and
// its body in one gathering write, bounded as write_response is.
boost::asio::awaitable<bool> write_head_and_body(MaybeTlsStream& client, std::string_view head,
                                                 std::string_view body);

}  // namespace pdgate
