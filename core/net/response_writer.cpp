#include "core/net/response_writer.hpp"

#include <array>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "core/net/http_head.hpp"

namespace pdgate {

namespace net = boost::asio;
namespace http = boost::beast::http;

namespace {
// A client that stops reading must not pin the connection forever.
constexpr auto kStalledClient = std::chrono::seconds(60);
}  // namespace

net::awaitable<bool> write_response(MaybeTlsStream& client,
                                    http::response<http::string_body>& res) {
  if (!head_renders_message(res)) {
    client.expires_after(kStalledClient);
    auto [ec, n] = co_await http::async_write(client, res, net::as_tuple(net::use_awaitable));
    co_return !ec;
  }
  const std::string head = render_head(res.base());
  boost::beast::error_code ec;
  if (auto rest = write_head_and_body(client, head, res.body(), ec))
    ec = co_await std::move(*rest);
  co_return !ec;
}

std::optional<net::awaitable<boost::beast::error_code>> write_head_and_body(
    MaybeTlsStream& client, std::string_view head, std::string_view body,
    boost::beast::error_code& ec) {
  client.expires_after(kStalledClient);
  const std::array<net::const_buffer, 2> parts{net::buffer(head), net::buffer(body)};
  return client.write(parts, ec);
}

}  // namespace pdgate
