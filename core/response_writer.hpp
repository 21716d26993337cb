// Writing a whole response to a client connection.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http.hpp>
#include "core/maybe_tls_stream.hpp"

namespace pdgate {

// Writes `res` (head and body in one gathering write when it can); returns
// false if the client is gone or stopped reading for 60 s.
boost::asio::awaitable<bool> write_response(
    MaybeTlsStream& client, boost::beast::http::response<boost::beast::http::string_body>& res);

}  // namespace pdgate
