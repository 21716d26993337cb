// Writing a whole response to a client connection.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

namespace pdgate {

// Writes `res` (head and body in one gathering write when it can); returns
// false if the client is gone or stopped reading for 60 s.
boost::asio::awaitable<bool> write_response(
    boost::beast::tcp_stream& client,
    boost::beast::http::response<boost::beast::http::string_body>& res);

}  // namespace pdgate
