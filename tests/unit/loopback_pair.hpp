// Two connected TCP sockets on loopback, on the caller's io_context:
// `server` plays the gateway's side of a connection, `client` its peer.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace pdgate::test {

struct LoopbackPair {
  explicit LoopbackPair(boost::asio::io_context& ioc) : server(ioc), client(ioc) {
    using boost::asio::ip::tcp;
    tcp::acceptor acc(ioc, tcp::endpoint(boost::asio::ip::address_v4::loopback(), 0));
    client.connect(acc.local_endpoint());
    acc.accept(server);
  }
  boost::asio::ip::tcp::socket server;
  boost::asio::ip::tcp::socket client;
};

}  // namespace pdgate::test
