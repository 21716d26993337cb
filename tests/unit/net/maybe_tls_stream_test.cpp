// MaybeTlsStream::write (core/net/maybe_tls_stream.hpp): what the socket takes
// at once leaves without an asynchronous operation; what it does not (a
// peer that is not reading) is written by the returned awaitable, which
// keeps its own copy of the buffer sequence, so the caller's temporary
// sequence may be gone by then. Every byte arrives, in order.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/read.hpp>
#include <boost/beast/core/buffers_cat.hpp>
#include <boost/beast/http/chunk_encode.hpp>

#include "core/net/maybe_tls_stream.hpp"
#include "tests/unit/loopback_pair.hpp"

namespace pdgate {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

using Pair = test::LoopbackPair;

TEST(MaybeTlsStreamWrite, SmallWriteLeavesAtOnce) {
  net::io_context ioc;
  Pair p(ioc);
  MaybeTlsStream stream(std::move(p.server));
  beast::error_code ec;
  auto rest = stream.write(net::buffer(std::string_view("hello")), ec);
  EXPECT_FALSE(rest.has_value());
  EXPECT_FALSE(ec);
  char buf[5];
  net::read(p.client, net::buffer(buf));
  EXPECT_EQ(std::string_view(buf, 5), "hello");
}

// 16 MiB as one HTTP chunk to a peer that starts reading 200 ms later: the
// socket takes part at once, the awaitable writes the rest after the
// chunk's header object (a temporary of the call) is gone.
TEST(MaybeTlsStreamWrite, RestIsWrittenByTheAwaitable) {
  net::io_context ioc;
  Pair p(ioc);
  MaybeTlsStream stream(std::move(p.server));
  std::string body(16u << 20, '\0');
  for (std::size_t i = 0; i < body.size(); ++i)
    body[i] = static_cast<char>('a' + i % 26);
  bool had_rest = false;
  beast::error_code result = net::error::fault;
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        beast::error_code ec;
        stream.expires_after(std::chrono::seconds(30));
        auto rest = stream.write(beast::buffers_cat(beast::http::make_chunk(net::buffer(body)),
                                                    beast::http::make_chunk_last()),
                                 ec);
        had_rest = rest.has_value();
        if (rest)
          ec = co_await std::move(*rest);
        stream.expires_never();
        result = ec;
      },
      net::detached);
  std::string got;
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    char buf[65536];
    beast::error_code ec;
    while (!ec && got.size() < body.size() + 64) {
      const std::size_t n = p.client.read_some(net::buffer(buf), ec);
      got.append(buf, n);
      if (got.ends_with("\r\n0\r\n\r\n"))
        break;
    }
  });
  ioc.run();
  reader.join();
  EXPECT_TRUE(had_rest);
  EXPECT_FALSE(result) << result.message();
  // "1000000\r\n" + body + "\r\n" + "0\r\n\r\n"
  ASSERT_EQ(got.size(), 9 + body.size() + 2 + 5);
  EXPECT_EQ(got.substr(0, 9), "1000000\r\n");
  EXPECT_TRUE(got.compare(9, body.size(), body) == 0);
  EXPECT_EQ(got.substr(9 + body.size()), "\r\n0\r\n\r\n");
}

}  // namespace
}  // namespace pdgate
