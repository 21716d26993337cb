// The client request's header, parsed without Beast's generic parser when
// it is plain: the fast path of core/gateway/client_session.cpp's read_request.
//
// Beast's request parser spent ~3.6k instructions on a three-field header
// (a tenth of a one-hop request): per field a name hash, list validation,
// virtual callbacks and bookkeeping for the body it would read later. A
// request whose header is complete in the first read and uses nothing
// unusual is read here in one pass and put straight into the request
// message; anything else (an incomplete header, a malformed one, chunked
// framing, Upgrade, obs-fold, a Content-Length list or repeat, bytes
// outside printable ASCII, an unknown method, HTTP versions but 1.0 and
// 1.1, a header or declared body over the limits) is left to Beast's
// parser, which reads, refuses and words the error exactly as before.
//
// So this parser only ever accepts a subset of what Beast accepts, and
// builds the same message from it: the fuzz target fuzz_request checks
// both on the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

namespace pdgate {

struct RequestHeadLimits {
  std::size_t header_bytes = 0;  // Beast's header_limit
  std::uint64_t body_bytes = 0;  // Beast's body_limit
};

struct PlainRequestHead {
  std::size_t size = 0;              // bytes of the header, its empty line included
  std::uint64_t content_length = 0;  // 0 when the request has no Content-Length
};

// Parses the header at the start of `bytes` into `req` (method, target,
// version, every field in order) when it is complete and plain; nullopt
// (and `req` untouched) when Beast's parser must read it instead.
std::optional<PlainRequestHead> parse_plain_request_head(
    std::string_view bytes, const RequestHeadLimits& limits,
    boost::beast::http::request<boost::beast::http::string_body>& req);

}  // namespace pdgate
