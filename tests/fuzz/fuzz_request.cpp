// The client request path as pdgate reads it (core/gateway/client_session.cpp):
// the plain-header fast path (core/net/request_head.cpp) checked against
// Beast's request parser with pdgate's body type and limits, the framing
// check before any body byte is read (core/net/request_framing.cpp), the Via
// loop check, then the pipeline's first steps on the body: the JSON index
// and the request facts, for a chat and for a completion.
//
// The first byte picks the size of the pieces the bytes arrive in (as
// reads from a socket would); the parse must not depend on it. Invariants
// beyond "no crash": a request accepted by the framing check has a
// Content-Length body or a chunked one, never both, and the body the
// parser delivers is as long as its Content-Length says. Differential:
// every header the fast path accepts, Beast's parser accepts too (also
// with a header limit one byte over its size), and both build the same
// method, target, version, fields and body.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>

#include "core/base/json_body.hpp"
#include "core/net/http_body.hpp"
#include "core/net/loop_guard.hpp"
#include "core/net/request_framing.hpp"
#include "core/net/request_head.hpp"
#include "core/routing/request_facts.hpp"

namespace http = boost::beast::http;

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant failed: %s\n", what);
    std::abort();
  }
}

// The gateway's limits, scaled down so the fuzzer reaches them.
constexpr std::uint32_t kHeaderLimit = 4096;
constexpr std::uint64_t kBodyLimit = 64 * 1024;

using Field = std::tuple<http::field, std::string, std::string>;

// A header's fields, in order, as (enum, name as sent, value).
std::vector<Field> fields_of(const http::request_header<>& h) {
  std::vector<Field> out;
  for (const auto& f : h)
    out.emplace_back(f.name(), std::string(f.name_string()), std::string(f.value()));
  return out;
}

struct Outcome {
  bool header_done = false;
  bool done = false;
  boost::beast::error_code ec;
  std::string target;
  std::string body;
  std::size_t consumed = 0;
  http::verb method = http::verb::unknown;
  unsigned version = 0;
  std::vector<Field> fields;
};

// Parses one request from `bytes`, `piece` bytes at a time (the parser
// may leave bytes unconsumed; they stay at the front of the next read).
Outcome parse(std::string_view bytes, std::size_t piece,
              std::uint32_t header_limit = kHeaderLimit) {
  http::request_parser<pdgate::AppendStringBody> parser;
  parser.header_limit(header_limit);
  parser.body_limit(kBodyLimit);
  parser.eager(true);
  Outcome out;
  std::string pending;
  std::size_t at = 0;
  while (!parser.is_done()) {
    if (at < bytes.size()) {
      pending.append(bytes.substr(at, piece));
      at += piece;
    }
    const bool last = at >= bytes.size();
    std::size_t used = 0;
    do {
      used = parser.put(boost::asio::buffer(pending), out.ec);
      pending.erase(0, used);
      out.consumed += used;
      if (out.ec == http::error::need_more)
        out.ec = {};
    } while (!out.ec && used > 0 && !pending.empty() && !parser.is_done());
    if (out.ec)
      break;
    if (last && !parser.is_done()) {
      if (pending.empty() || used == 0) {
        parser.put_eof(out.ec);
        break;
      }
    }
  }
  out.header_done = parser.is_header_done();
  out.done = parser.is_done();
  if (out.header_done) {
    out.target = std::string(parser.get().target());
    out.method = parser.get().method();
    out.version = parser.get().version();
    out.fields = fields_of(parser.get().base());
  }
  if (out.done)
    out.body = parser.get().body();
  if (out.header_done) {
    const auto& h = parser.get().base();
    // The framing check runs on every header the parser accepted.
    const auto refusal = pdgate::check_request_framing(h);
    if (!refusal && out.done) {
      const bool chunked = parser.chunked();
      const auto len = parser.content_length();
      check(!(chunked && len), "accepted with both Content-Length and chunked");
      if (len)
        check(out.body.size() == *len, "body length differs from Content-Length");
    }
    if (auto via = h.find(http::field::via); via != h.end()) {
      static const pdgate::LoopGuard guard("pdgate-fuzz0001");
      (void)guard.refusal(via->value());
      (void)guard.via_for_upstream(via->value());
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0)
    return 0;
  const std::size_t piece = data[0] % 32 + 1;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Outcome whole = parse(bytes, bytes.size() + 1);
  const Outcome split = parse(bytes, piece);
  check(whole.done == split.done, "completion depends on how the bytes arrived");
  if (whole.done) {
    check(whole.target == split.target, "target depends on how the bytes arrived");
    check(whole.body == split.body, "body depends on how the bytes arrived");
  }
  // The fast path accepts a subset of what Beast accepts, read the same.
  http::request<http::string_body> plain_req;
  if (const auto plain = pdgate::parse_plain_request_head(
          bytes, pdgate::RequestHeadLimits{kHeaderLimit, kBodyLimit}, plain_req)) {
    check(whole.header_done, "fast path accepted a header Beast refuses");
    check(plain_req.method() == whole.method, "fast path read another method");
    check(plain_req.target() == whole.target, "fast path read another target");
    check(plain_req.version() == whole.version, "fast path read another version");
    check(fields_of(plain_req.base()) == whole.fields, "fast path read other fields");
    check(!pdgate::check_request_framing(plain_req.base()), "fast path took a refused framing");
    const auto len = plain->content_length;
    if (bytes.size() - plain->size >= len) {
      check(whole.done, "Beast did not finish a body the fast path has whole");
      check(whole.body == bytes.substr(plain->size, len), "fast path read another body");
    }
    const Outcome tight =
        parse(bytes, bytes.size() + 1, static_cast<std::uint32_t>(plain->size + 1));
    check(tight.header_done, "fast path accepted a header over Beast's limit");
  }
  if (!whole.done)
    return 0;
  // The pipeline's first steps on the body.
  if (auto index = pdgate::index_json_object(whole.body)) {
    for (bool chat : {true, false}) {
      if (auto facts = pdgate::read_facts(whole.body, *index, chat))
        (void)facts;
    }
  }
  return 0;
}
