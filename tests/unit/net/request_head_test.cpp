// parse_plain_request_head (core/net/request_head.hpp): the client header's
// fast path reads plain headers into the message exactly as Beast's parser
// would, and leaves every other header to Beast (nullopt, message
// untouched). tests/fuzz/fuzz_request.cpp checks the same against Beast on
// arbitrary bytes.
#include "core/net/request_head.hpp"

#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

namespace pdgate {
namespace {

namespace http = boost::beast::http;

constexpr RequestHeadLimits kLimits{8192, 1 << 20};

struct PlainParse {
  std::optional<PlainRequestHead> head;
  http::request<http::string_body> req;
};

PlainParse parse_head(std::string_view bytes, RequestHeadLimits limits = kLimits) {
  PlainParse p;
  p.head = parse_plain_request_head(bytes, limits, p.req);
  return p;
}

TEST(RequestHead, ReadsAPlainPostIntoTheMessage) {
  const std::string head =
      "POST /v1/chat/completions?x=1 HTTP/1.1\r\n"
      "Host: gw:8000\r\n"
      "Content-Type:  application/json \t\r\n"
      "X-Empty:\r\n"
      "Connection: keep-alive, , Foo\r\n"
      "Content-Length: 17\r\n"
      "\r\n";
  const PlainParse p = parse_head(head + "{\"model\":\"m\"}xxxxNEXT");
  ASSERT_TRUE(p.head);
  EXPECT_EQ(p.head->size, head.size());
  EXPECT_EQ(p.head->content_length, 17u);
  EXPECT_EQ(p.req.method(), http::verb::post);
  EXPECT_EQ(p.req.target(), "/v1/chat/completions?x=1");
  EXPECT_EQ(p.req.version(), 11u);
  std::vector<std::pair<std::string, std::string>> fields;
  for (const auto& f : p.req)
    fields.emplace_back(f.name_string(), f.value());
  const std::vector<std::pair<std::string, std::string>> want{{"Host", "gw:8000"},
                                                              {"Content-Type", "application/json"},
                                                              {"X-Empty", ""},
                                                              {"Connection", "keep-alive, , Foo"},
                                                              {"Content-Length", "17"}};
  EXPECT_EQ(fields, want);
  // Known names get their enum, so lookups by field find them.
  EXPECT_EQ(p.req[http::field::content_type], "application/json");
  EXPECT_TRUE(p.req.keep_alive());
  EXPECT_TRUE(p.req.body().empty());  // the body is the caller's to read
}

TEST(RequestHead, NoContentLengthIsAnEmptyBody) {
  const PlainParse p = parse_head("GET /metrics HTTP/1.0\r\nConnection: close\r\n\r\n");
  ASSERT_TRUE(p.head);
  EXPECT_EQ(p.head->content_length, 0u);
  EXPECT_EQ(p.req.method(), http::verb::get);
  EXPECT_EQ(p.req.version(), 10u);
  EXPECT_FALSE(p.req.keep_alive());
}

TEST(RequestHead, LeavesEveryOtherHeaderToBeast) {
  const std::vector<std::string> others{
      // incomplete
      "POST /v1/completions HTTP/1.1\r\nHost: a\r\n",
      // framing Beast decides
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
      "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
      "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
      "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
      "POST / HTTP/1.1\r\nContent-Length: 12345678901234567890\r\n\r\n",
      "GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
      "GET / HTTP/1.1\r\nConnection: a;b\r\n\r\n",
      // syntax
      "GET / HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n", "GET / HTTP/1.1\r\nX-A : 1\r\n\r\n",
      "GET / HTTP/1.1\r\n: 1\r\n\r\n", "GET / HTTP/1.1\r\nX-A: caf\xc3\xa9\r\n\r\n",
      "GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n", "GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n",
      "GET  / HTTP/1.1\r\n\r\n", "GET / HTTP/2.0\r\n\r\n", "GET / http/1.1\r\n\r\n",
      "GET / HTTP/1.1 \r\n\r\n", "\r\nGET / HTTP/1.1\r\n\r\n",
      "BREW /pot HTTP/1.1\r\n\r\n",  // a method Beast has no enum for
  };
  for (const auto& bytes : others) {
    const PlainParse p = parse_head(bytes);
    EXPECT_FALSE(p.head) << bytes;
    EXPECT_TRUE(p.req.target().empty()) << bytes;
    EXPECT_EQ(p.req.begin(), p.req.end()) << bytes;
  }
}

TEST(RequestHead, LeavesHeadersAndBodiesOverTheLimitsToBeast) {
  const std::string head = "POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n";
  EXPECT_TRUE(parse_head(head, {head.size() + 1, 100}).head);
  // Beast words the refusals (431, 413).
  EXPECT_FALSE(parse_head(head, {head.size(), 100}).head);
  EXPECT_FALSE(parse_head(head, {head.size() + 1, 99}).head);
  // More fields than the fast path lists.
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 65; ++i)
    many += "X-F" + std::to_string(i) + ": v\r\n";
  many += "\r\n";
  EXPECT_FALSE(parse_head(many).head);
}

}  // namespace
}  // namespace pdgate
