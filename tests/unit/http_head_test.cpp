// Client answers are written as a hand-rendered head plus the body
// (core/http_head.hpp): the bytes must be exactly what Beast's serializer
// writes for the same message.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include <boost/beast/http.hpp>

#include "core/errors.hpp"
#include "core/http_head.hpp"

namespace pdgate {
namespace {

namespace http = boost::beast::http;

std::string beast_bytes(const http::response<http::string_body>& m) {
  std::ostringstream os;
  os << m;
  return os.str();
}

std::string our_bytes(const http::response<http::string_body>& m) {
  EXPECT_TRUE(head_renders_message(m));
  return render_head(m.base()) + m.body();
}

TEST(HttpHead, ResponsesSameBytesAsBeast) {
  http::response<http::string_body> ok{http::status::ok, 11};
  ok.set(http::field::server, "pdgate");
  ok.set(http::field::content_type, "application/json");
  ok.set("X-Request-Id", "r-1");
  ok.keep_alive(true);
  ok.body() = R"({"choices":[{"text":" Paris"}]})";
  ok.prepare_payload();
  EXPECT_EQ(our_bytes(ok), beast_bytes(ok));

  // Closing, HTTP/1.0 keep-alive, an error answer, an unusual status and
  // reason, an empty body.
  http::response<http::string_body> close = ok;
  close.keep_alive(false);
  EXPECT_EQ(our_bytes(close), beast_bytes(close));

  http::response<http::string_body> old{http::status::ok, 10};
  old.keep_alive(true);
  old.body() = "{}";
  old.prepare_payload();
  EXPECT_EQ(our_bytes(old), beast_bytes(old));

  auto err = make_error_response(client_error(ErrorKind::body_too_large, "too big"), 11, false);
  EXPECT_EQ(our_bytes(err), beast_bytes(err));

  http::response<http::string_body> odd{static_cast<http::status>(499), 11};
  odd.prepare_payload();
  EXPECT_EQ(our_bytes(odd), beast_bytes(odd));
  odd.reason("Client Closed Request");
  EXPECT_EQ(our_bytes(odd), beast_bytes(odd));
  EXPECT_EQ(render_head(odd.base()).rfind("HTTP/1.1 499 Client Closed Request\r\n", 0), 0u);
}

TEST(HttpHead, ChunkedAnswersLeftToBeast) {
  http::response<http::string_body> chunked{http::status::ok, 11};
  chunked.body() = "{}";
  chunked.chunked(true);
  EXPECT_FALSE(head_renders_message(chunked));
  http::response<http::string_body> http2{http::status::ok, 20};
  EXPECT_FALSE(head_renders_message(http2));
}

}  // namespace
}  // namespace pdgate
