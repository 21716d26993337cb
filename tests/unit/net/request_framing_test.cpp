// check_request_framing: which Transfer-Encoding headers a request may
// carry (RFC 9112 section 6) and the status the others get.
#include "core/net/request_framing.hpp"

#include <gtest/gtest.h>

namespace pdgate {
namespace {

namespace http = boost::beast::http;

http::request_header<> head(std::vector<std::string> te, unsigned version = 11,
                            bool content_length = false) {
  http::request_header<> h;
  h.method(http::verb::post);
  h.target("/v1/completions");
  h.version(version);
  for (auto& v : te)
    h.insert(http::field::transfer_encoding, v);
  if (content_length)
    h.set(http::field::content_length, "5");
  return h;
}

unsigned status_of(const http::request_header<>& h) {
  auto e = check_request_framing(h);
  return e ? status_of(*e) : 0;
}

// No Transfer-Encoding, or exactly chunked in any case and spacing (also
// split over empty list elements), is accepted.
TEST(RequestFraming, AcceptsNoneOrALoneChunked) {
  EXPECT_EQ(status_of(head({})), 0u);
  EXPECT_EQ(status_of(head({"chunked"})), 0u);
  EXPECT_EQ(status_of(head({"  CHUNKED\t"})), 0u);
  EXPECT_EQ(status_of(head({", chunked,"})), 0u);
}

// A final coding other than chunked, a malformed token, chunked twice,
// chunked with Content-Length or in HTTP/1.0: 400.
TEST(RequestFraming, RefusesWhatCannotBeFramed) {
  for (const char* te : {"gzip", "xchunked", "chunked, identity", "\"chunked\"", "identity",
                         "chunked;x=1", "", " , "}) {
    EXPECT_EQ(status_of(head({te})), 400u) << te;
  }
  EXPECT_EQ(status_of(head({"chunked", "chunked"})), 400u);
  EXPECT_EQ(status_of(head({"chunked, chunked"})), 400u);
  EXPECT_EQ(status_of(head({"chunked"}, 10)), 400u);
  EXPECT_EQ(status_of(head({"chunked"}, 11, true)), 400u);
}

// A coding pdgate would have to decode before chunked: 501, named.
TEST(RequestFraming, UnsupportedCodingBeforeChunkedIs501) {
  auto e = check_request_framing(head({"gzip, chunked"}));
  ASSERT_TRUE(e);
  EXPECT_EQ(status_of(*e), 501u);
  EXPECT_NE(e->message.find("gzip"), std::string::npos);
  EXPECT_EQ(status_of(head({"gzip", "chunked"})), 501u);
}

}  // namespace
}  // namespace pdgate
