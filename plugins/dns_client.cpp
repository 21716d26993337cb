#include "plugins/dns_client.hpp"
#include "core/base/use_tuple.hpp"

#include <array>
#include <random>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace pdgate {

namespace net = boost::asio;

namespace {
// The largest answer read: a few dozen addresses fit many times over.
constexpr std::size_t kMaxMessage = 4096;
}  // namespace

const char* to_string(DnsFailure f) {
  switch (f) {
    case DnsFailure::timeout:
      return "timeout";
    case DnsFailure::network:
      return "network";
    case DnsFailure::server_error:
      return "server_error";
    case DnsFailure::malformed:
      return "malformed";
  }
  return "network";
}

net::awaitable<DnsLookup> dns_lookup(net::any_io_executor ex, std::string server,
                                     std::uint16_t port, std::string name, DnsType type,
                                     std::chrono::milliseconds timeout) {
  using namespace net::experimental::awaitable_operators;
  boost::system::error_code ec;
  const auto address = net::ip::make_address(server, ec);
  if (ec)
    co_return DnsLookup{fail("DNS server '" + server + "' is not an address")};
  thread_local std::mt19937 rng{std::random_device{}()};
  const auto id = static_cast<std::uint16_t>(rng());
  auto query = dns_query(id, name, type);
  if (!query)
    co_return DnsLookup{fail(query.error()), DnsFailure::malformed};
  net::ip::udp::socket sock(ex);
  sock.open(address.is_v4() ? net::ip::udp::v4() : net::ip::udp::v6(), ec);
  if (ec)
    co_return DnsLookup{fail("DNS: " + ec.message())};
  const net::ip::udp::endpoint to(address, port);
  // connect(): only the server's datagrams are delivered to this socket.
  sock.connect(to, ec);
  if (ec)
    co_return DnsLookup{fail("DNS: " + ec.message())};
  auto [sec, sent] = co_await sock.async_send(net::buffer(*query), use_tuple);
  if (sec)
    co_return DnsLookup{fail("DNS: " + sec.message())};
  net::steady_timer deadline(ex);
  deadline.expires_after(timeout);
  std::array<char, kMaxMessage> buf{};
  for (;;) {
    auto result = co_await (sock.async_receive(net::buffer(buf), use_tuple) ||
                            deadline.async_wait(use_tuple));
    if (result.index() == 1)
      co_return DnsLookup{fail("no answer from DNS server " + server + " within " +
                               std::to_string(timeout.count()) + " ms"),
                          DnsFailure::timeout};
    auto [rec, n] = std::get<0>(result);
    if (rec)
      co_return DnsLookup{fail("DNS: " + rec.message())};
    auto answer = dns_parse_response(std::string_view(buf.data(), n), id, type);
    // A stray datagram (another id) is not the answer: wait on.
    if (!answer && answer.error() == "DNS answer to another query")
      continue;
    if (answer)
      co_return DnsLookup{std::move(answer)};
    // The header's RCODE (low 4 bits of byte 3) says whether the server
    // answered an error or sent something that does not parse.
    const bool rcode = n >= 4 && (static_cast<unsigned char>(buf[3]) & 0x0f) != 0;
    co_return DnsLookup{std::move(answer),
                        rcode ? DnsFailure::server_error : DnsFailure::malformed};
  }
}

}  // namespace pdgate
