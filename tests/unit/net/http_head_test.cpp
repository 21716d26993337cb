// Client answers are written as a hand-rendered head plus the body
// (core/net/http_head.hpp): the bytes must be exactly what Beast's serializer
// writes for the same message.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>

#include <boost/beast/http.hpp>

#include "core/net/errors.hpp"
#include "core/net/http_head.hpp"
#include "core/pipeline/engine_call.hpp"
#include "core/pipeline/forwarded_headers.hpp"
#include "core/upstream/instance.hpp"

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

TEST(HttpHead, AssembledFromPiecesInOrder) {
  const std::string empty = assemble_head([](auto&&) {});
  EXPECT_EQ(empty, "");
  const std::string long_piece(300, 'x');
  const std::string head = assemble_head([&](auto&& put) {
    put("GET / HTTP/1.1\r\n");
    put("");
    put(long_piece);
    put(std::string_view("\r\nA: b\r\n\r\n"));
  });
  EXPECT_EQ(head, "GET / HTTP/1.1\r\n" + long_piece + "\r\nA: b\r\n\r\n");
  EXPECT_EQ(head.size(), std::strlen(head.c_str()));  // no room left over
}

TEST(HttpHead, FirstFieldByItsEnum) {
  http::request<http::string_body> req{http::verb::post, "/", 11};
  EXPECT_FALSE(first_field(req, http::field::content_type));
  req.insert("X-Other", "1");
  req.insert(http::field::content_type, "application/json");
  req.insert("content-type", "text/plain");  // a second line: the first wins, as with find()
  ASSERT_TRUE(first_field(req, http::field::content_type));
  EXPECT_EQ(*first_field(req, http::field::content_type), "application/json");
  EXPECT_EQ(*first_field(req, http::field::content_type),
            req.find(http::field::content_type)->value());
  EXPECT_FALSE(first_field(req, http::field::via));
}

// The head written for a stage's engine request is byte for byte what Beast
// writes for the same request built as a message (upstream_request), with
// and without each optional field.
TEST(UpstreamHead, SameBytesAsBeastForTheSameRequest) {
  auto spec = parse_upstream(Role::decode, "http://10.1.2.3:8100");
  ASSERT_TRUE(spec) << spec.error();
  const Instance inst(4, *spec);
  ForwardedHeaders bare;
  ForwardedHeaders full;
  full.authorization = "Bearer sk-engine";
  full.via = "1.1 pdgate-a";
  full.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  full.tracestate = "vendor=1";
  full.baggage = "user=7";
  full.x_forwarded_for = "10.0.0.9, 127.0.0.1";
  full.forwarded = "for=127.0.0.1;proto=http";
  full.extra = {{"X-Tenant", "blue"}};
  full.policy_set = {{"X-Lane", "fast"}};
  for (const ForwardedHeaders* fwd : {&bare, &full}) {
    for (const std::string_view own_span : {std::string_view(), std::string_view("00-1-2-01")}) {
      for (const std::size_t size : {std::size_t{0}, std::size_t{7}, std::size_t{123456789}}) {
        const std::string body(size > 100 ? 0 : size, 'b');
        auto req = upstream_request(http::verb::post, inst, "/v1/chat/completions?x=1", body,
                                    "req-1", *fwd, own_span);
        req.content_length(size);
        std::ostringstream beast;
        beast << req.base();
        EXPECT_EQ(upstream_head(http::verb::post, inst, "/v1/chat/completions?x=1", size, "req-1",
                                *fwd, own_span),
                  beast.str());
      }
    }
    auto get = upstream_request(http::verb::get, inst, "/health", "", "req-2", *fwd, {});
    std::ostringstream beast;
    beast << get.base();
    EXPECT_EQ(upstream_head(http::verb::get, inst, "/health", 0, "req-2", *fwd, {}), beast.str());
  }
}

}  // namespace
}  // namespace pdgate
