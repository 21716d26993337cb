#include "core/response_writer.hpp"

#include <array>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "core/http_head.hpp"

namespace pdgate {

namespace net = boost::asio;
namespace http = boost::beast::http;

net::awaitable<bool> write_response(MaybeTlsStream& client,
                                    http::response<http::string_body>& res) {
  constexpr auto use_tuple = net::as_tuple(net::use_awaitable);
  // A client that stops reading must not pin the connection forever.
  client.expires_after(std::chrono::seconds(60));
  if (!head_renders_message(res)) {
    auto [ec, n] = co_await http::async_write(client, res, use_tuple);
    co_return !ec;
  }
  const std::string head = render_head(res.base());
  const std::array<net::const_buffer, 2> parts{net::buffer(head), net::buffer(res.body())};
  co_return !co_await client.write_all(parts);
}

}  // namespace pdgate
