// ChunkFraming (core/net/chunk_framing.hpp): the bytes a relayed stream's
// pieces put on the wire, and that a strict HTTP parser reads them back.
#include <gtest/gtest.h>

#include <string>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "core/net/chunk_framing.hpp"

namespace pdgate {
namespace {

namespace http = boost::beast::http;

std::string bytes_of(const ChunkFraming& f) {
  std::string out;
  for (const auto& b : f.buffers())
    out.append(static_cast<const char*>(b.data()), b.size());
  return out;
}

TEST(ChunkFraming, EachCaseOnTheWire) {
  EXPECT_EQ(bytes_of(ChunkFraming("", "data: x\n\n", false)), "9\r\ndata: x\n\n\r\n");
  EXPECT_EQ(bytes_of(ChunkFraming("", "data: x\n\n", true)), "9\r\ndata: x\n\n\r\n0\r\n\r\n");
  EXPECT_EQ(bytes_of(ChunkFraming("", "", true)), "0\r\n\r\n");
  EXPECT_EQ(bytes_of(ChunkFraming("HEAD\r\n\r\n", "", false)), "HEAD\r\n\r\n");
  EXPECT_EQ(bytes_of(ChunkFraming("HEAD\r\n\r\n", "", true)), "HEAD\r\n\r\n0\r\n\r\n");
  EXPECT_EQ(bytes_of(ChunkFraming("HEAD\r\n\r\n", "abc", true)),
            "HEAD\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
  EXPECT_EQ(bytes_of(ChunkFraming("", "", false)), "");
}

TEST(ChunkFraming, SizeLineInLowerCaseHex) {
  for (const auto& [n, line] : {std::pair<std::size_t, std::string>{1, "1"},
                                {15, "f"},
                                {16, "10"},
                                {255, "ff"},
                                {256, "100"},
                                {4096, "1000"},
                                {0xabcde, "abcde"}}) {
    const std::string data(n, 'x');
    const std::string wire = bytes_of(ChunkFraming("", data, false));
    EXPECT_EQ(wire, line + "\r\n" + data + "\r\n") << n;
  }
}

// Pieces of every shape after a response head, as a relay writes them,
// read back by Beast's parser: the body is the pieces' data in order.
TEST(ChunkFraming, ParserReadsPiecesBack) {
  const std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  std::string wire = bytes_of(ChunkFraming(head, "first", false));
  std::string expected = "first";
  for (std::size_t n : {1u, 17u, 300u, 70000u}) {
    const std::string data(n, static_cast<char>('a' + n % 26));
    wire += bytes_of(ChunkFraming("", data, false));
    expected += data;
  }
  wire += bytes_of(ChunkFraming("", "", false));  // nothing: no chunk
  wire += bytes_of(ChunkFraming("", "end", true));
  expected += "end";

  http::response_parser<http::string_body> p;
  p.body_limit(1 << 20);
  boost::beast::error_code ec;
  std::size_t used = 0;
  while (used < wire.size() && !ec) {
    const std::size_t n = p.put(boost::asio::buffer(wire.data() + used, wire.size() - used), ec);
    if (ec == http::error::need_more)
      ec = {};
    if (n == 0 && !ec)
      break;
    used += n;
  }
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_TRUE(p.is_done());
  EXPECT_EQ(used, wire.size());
  EXPECT_EQ(p.get().body(), expected);
}

}  // namespace
}  // namespace pdgate
