// EngineResponseParser (core/net/engine_response_parser.*): what the exchange
// gets from an engine's answer, framing by framing, and what it refuses.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include <boost/beast/http/error.hpp>

#include "core/net/engine_response_parser.hpp"

namespace pdgate {
namespace {

namespace http = boost::beast::http;

struct Parsed {
  boost::beast::error_code ec;  // the first error other than need_more/need_buffer
  bool done = false;
  bool keep_alive = false;
  unsigned status = 0;
  std::string content_type;
  std::string cache_control;
  std::string body;
};

// Feeds `bytes` `piece` bytes at a time (as reads would bring them), lends
// `room` bytes per parse, and ends the connection after the last byte when
// `eof`. Eager once the header is in, as the exchange is.
Parsed parse(std::string_view bytes, std::size_t piece = 1 << 20, std::size_t room = 1 << 20,
             bool eof = false) {
  EngineResponseParser p;
  Parsed out;
  std::string buffer;
  std::size_t fed = 0;
  while (!p.is_done()) {
    boost::beast::error_code ec;
    std::size_t used = 0;
    if (!buffer.empty()) {
      std::string lent(room, '\0');
      p.lend(lent.data(), room);
      used = p.put(boost::asio::buffer(buffer), ec);
      out.body.append(lent.data(), room - p.room_left());
      p.lend(nullptr, 0);
      buffer.erase(0, used);
      if (p.is_header_done())
        p.eager(true);
    }
    if (ec && ec != http::error::need_more && ec != http::error::need_buffer) {
      out.ec = ec;
      break;
    }
    if (p.is_done())
      break;
    if (!buffer.empty() && ec != http::error::need_more && used != 0)
      continue;
    if (fed < bytes.size()) {
      const std::size_t n = std::min(piece, bytes.size() - fed);
      buffer.append(bytes.substr(fed, n));
      fed += n;
      continue;
    }
    if (eof) {
      p.put_eof(ec);
      out.ec = ec;
    }
    break;
  }
  out.done = p.is_done();
  out.keep_alive = p.keep_alive();
  out.status = p.status();
  out.content_type = p.content_type();
  out.cache_control = p.cache_control();
  return out;
}

TEST(EngineResponseParser, ContentLengthBody) {
  const std::string answer =
      "HTTP/1.1 200 OK\r\ndate: Thu, 26 Nov 2026 04:00:00 GMT\r\nserver: uvicorn\r\n"
      "Content-Type: application/json\r\ncache-control: no-cache\r\ncontent-length: 11\r\n"
      "\r\n{\"ok\":true}";
  for (std::size_t piece : {1u, 2u, 7u, 1000u}) {
    for (std::size_t room : {1u, 3u, 64u}) {
      const Parsed r = parse(answer, piece, room);
      EXPECT_FALSE(r.ec) << r.ec.message();
      EXPECT_TRUE(r.done);
      EXPECT_TRUE(r.keep_alive);
      EXPECT_EQ(r.status, 200u);
      EXPECT_EQ(r.content_type, "application/json");
      EXPECT_EQ(r.cache_control, "no-cache");
      EXPECT_EQ(r.body, "{\"ok\":true}") << piece << " " << room;
    }
  }
}

TEST(EngineResponseParser, ChunkedBodyWithExtensionsAndTrailers) {
  const std::string answer =
      "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
      "b\r\ndata: one\n\n\r\n"
      "B;name=value;q=\"a \\\"b\"\r\ndata: two\n\n\r\n"
      "0\r\nx-trailer: t\r\n\r\n";
  for (std::size_t piece : {1u, 5u, 1000u}) {
    for (std::size_t room : {1u, 4u, 64u}) {
      const Parsed r = parse(answer, piece, room);
      EXPECT_FALSE(r.ec) << r.ec.message();
      EXPECT_TRUE(r.done);
      EXPECT_TRUE(r.keep_alive);
      EXPECT_EQ(r.content_type, "text/event-stream");
      EXPECT_EQ(r.body, "data: one\n\ndata: two\n\n") << piece << " " << room;
    }
  }
}

TEST(EngineResponseParser, BodyUntilTheConnectionCloses) {
  const std::string answer = "HTTP/1.1 200 OK\r\n\r\nall of it";
  Parsed r = parse(answer, 4, 3, /*eof=*/true);
  EXPECT_FALSE(r.ec) << r.ec.message();
  EXPECT_TRUE(r.done);
  EXPECT_FALSE(r.keep_alive);  // the close is the framing
  EXPECT_EQ(r.body, "all of it");
  // Transfer codings without chunked last: also up to the close.
  r = parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nzz", 100, 100, true);
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.body, "zz");
  r = parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nzz\r\n0\r\n\r\n");
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.body, "zz");
}

TEST(EngineResponseParser, KeepAliveByVersionAndConnection) {
  EXPECT_TRUE(parse("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").keep_alive);
  EXPECT_FALSE(
      parse("HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n").keep_alive);
  EXPECT_FALSE(parse("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").keep_alive);
  const Parsed r =
      parse("HTTP/1.0 200 OK\r\nconnection: foo, Keep-Alive\r\ncontent-length: 0\r\n\r\n");
  EXPECT_TRUE(r.done);
  EXPECT_TRUE(r.keep_alive);
}

TEST(EngineResponseParser, NoBodyStatuses) {
  for (const char* status : {"204 No Content", "304 Not Modified"}) {
    const Parsed r =
        parse(std::string("HTTP/1.1 ") + status + "\r\nContent-Length: 5\r\n\r\nhello");
    EXPECT_TRUE(r.done) << status;
    EXPECT_EQ(r.body, "") << status;
  }
}

// Interim answers (1xx but 101) are skipped, fields and all, whether they
// arrive with the final answer or byte by byte; the final answer's
// framing and fields are what count. More than kMaxInterimAnswers of them,
// or a 101 (never asked for), is an error.
TEST(EngineResponseParser, InterimAnswersAreSkipped) {
  const std::string hints =
      "HTTP/1.1 100 Continue\r\n\r\n"
      "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\nContent-Type: text/x\r\n"
      "Content-Length: 99\r\nConnection: close\r\n\r\n";
  const std::string answer =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
  for (std::size_t piece : {std::size_t{1} << 20, std::size_t{1}, std::size_t{7}}) {
    const Parsed r = parse(hints + answer, piece);
    EXPECT_FALSE(r.ec) << r.ec.message();
    EXPECT_TRUE(r.done);
    EXPECT_EQ(r.status, 200u);
    EXPECT_EQ(r.content_type, "application/json");
    EXPECT_EQ(r.body, "{}");
    EXPECT_TRUE(r.keep_alive);
  }
  std::string many;
  for (std::size_t i = 0; i <= EngineResponseParser::kMaxInterimAnswers; ++i)
    many += "HTTP/1.1 103 Early Hints\r\n\r\n";
  EXPECT_EQ(parse(many + answer).ec, http::error::bad_status);
  EXPECT_EQ(parse("HTTP/1.1 101 Switching Protocols\r\n\r\n" + answer).ec, http::error::bad_status);
}

// Without eager, the parse that completes the header stops there and the
// body's bytes stay with the caller.
TEST(EngineResponseParser, HeaderFirstUnlessEager) {
  const std::string answer = "HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbody";
  EngineResponseParser p;
  boost::beast::error_code ec;
  const std::size_t used = p.put(boost::asio::buffer(answer), ec);
  EXPECT_FALSE(ec);
  EXPECT_TRUE(p.is_header_done());
  EXPECT_FALSE(p.is_done());
  EXPECT_EQ(used, answer.size() - 4);
  EXPECT_EQ(p.status(), 503u);
  EXPECT_TRUE(p.got_some());
}

TEST(EngineResponseParser, ConnectionEndsEarly) {
  EngineResponseParser p;
  boost::beast::error_code ec;
  p.put(boost::asio::buffer(std::string_view("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n")), ec);
  ASSERT_TRUE(p.is_header_done());
  p.put_eof(ec);
  EXPECT_EQ(ec, http::error::partial_message);
  EngineResponseParser q;
  q.put(boost::asio::buffer(std::string_view("HTTP/1.1 200 O")), ec);
  EXPECT_EQ(ec, http::error::need_more);
  q.put_eof(ec);
  EXPECT_EQ(ec, http::error::partial_message);
}

TEST(EngineResponseParser, Refusals) {
  struct Case {
    const char* what;
    std::string bytes;
  };
  const std::string ok_tail = "\r\nContent-Length: 0\r\n\r\n";
  const Case cases[] = {
      {"HTTP/2", "HTTP/2.0 200 OK" + ok_tail},
      {"no version", "HTTQ/1.1 200 OK" + ok_tail},
      {"two-digit status", "HTTP/1.1 20 OK" + ok_tail},
      {"no space after the status", "HTTP/1.1 200" + ok_tail},
      {"control character in the reason", "HTTP/1.1 200 O\x01K" + ok_tail},
      {"field without colon", "HTTP/1.1 200 OK\r\nno colon\r\n\r\n"},
      {"space before colon", "HTTP/1.1 200 OK\r\nName : v\r\n\r\n"},
      {"obs-fold", "HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n"},
      {"bare LF in a field", "HTTP/1.1 200 OK\r\nA: b\nB: c\r\n\r\n"},
      {"bare CR in a field", "HTTP/1.1 200 OK\r\nA: b\rc\r\n\r\n"},
      {"two Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx"},
      {"Content-Length list", "HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\nx"},
      {"Content-Length not a number", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"},
      {"Content-Length too long",
       "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n"},
      {"Content-Length and chunked",
       "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"},
      {"chunked and Content-Length",
       "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n"},
      {"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n"},
      {"chunk size overflow",
       "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n"},
      {"bad chunk extension", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;;\r\nx\r\n"},
      {"space after a chunk size",
       "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0  \r\n\r\n"},
      {"space after a chunk extension",
       "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0;a \r\n\r\n"},
      {"no CRLF after chunk data",
       "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n0\r\n\r\n"},
      {"framing field in trailers",
       "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nContent-Length: 3\r\n\r\n"},
      {"header over the limit", "HTTP/1.1 200 OK\r\nX: " + std::string(9000, 'a') + "\r\n\r\n"},
  };
  for (const Case& c : cases) {
    const Parsed r = parse(c.bytes, 1 << 20, 1 << 20, true);
    EXPECT_TRUE(r.ec) << c.what;
    EXPECT_NE(r.ec, http::error::need_more) << c.what;
  }
}

}  // namespace
}  // namespace pdgate
