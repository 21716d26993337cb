// An engine's answer as the exchange reads it (core/upstream/upstream.cpp with
// core/net/engine_response_parser.hpp): the bytes arrive in pieces into one
// buffer, each parse writes body bytes into a room the caller lends, and
// the connection's end is told to the parser once. The first byte picks
// the piece size, the second the room; the rest is the answer.
//
// Invariants beyond "no crash": neither the piece size nor the room
// changes the outcome (status, Content-Type, whether it completed, the
// body), and a parse never writes past the room it was lent. And what it
// accepts Beast's HTTP parser (which the gateway used before) accepts too,
// with the same status, body and keep-alive: the parser may be stricter
// than Beast's, never more lenient or different.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "core/net/engine_response_parser.hpp"

namespace http = boost::beast::http;

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant failed: %s\n", what);
    std::abort();
  }
}

struct Outcome {
  bool failed = false;
  bool done = false;
  bool keep_alive = false;
  unsigned status = 0;
  std::string content_type;
  std::string body;
};

Outcome read(std::string_view bytes, std::size_t piece, std::size_t room) {
  pdgate::EngineResponseParser p;
  p.header_limit(4096);
  Outcome out;
  std::string buffer;
  std::size_t fed = 0;
  bool eof = false;
  while (!p.is_done()) {
    if (!p.is_header_done() && buffer.empty() && fed == bytes.size())
      eof = true;
    boost::beast::error_code ec;
    std::size_t used = 0;
    if (!buffer.empty()) {
      std::string lent(room + 8, '\x5a');  // a canary past the room
      p.lend(lent.data(), room);
      used = p.put(boost::asio::buffer(buffer), ec);
      const std::size_t wrote = room - p.room_left();
      check(wrote <= room, "wrote past the room");
      check(lent.substr(room) == std::string(8, '\x5a'), "canary overwritten");
      out.body.append(lent.data(), wrote);
      p.lend(nullptr, 0);
      buffer.erase(0, used);
      if (p.is_header_done() && !p.eager())
        p.eager(true);  // as the exchange does once the header is in
    }
    if (ec && ec != http::error::need_more && ec != http::error::need_buffer) {
      out.failed = true;
      break;
    }
    const bool stuck = buffer.empty() || ec == http::error::need_more || used == 0;
    if (!stuck)
      continue;
    if (fed < bytes.size()) {
      const std::size_t n = std::min(piece, bytes.size() - fed);
      buffer.append(bytes.substr(fed, n));
      fed += n;
      continue;
    }
    // Every byte is in: the connection's end.
    eof = true;
    if (p.got_some()) {
      p.put_eof(ec);
      out.failed = static_cast<bool>(ec);
    } else {
      out.failed = true;
    }
    break;
  }
  (void)eof;
  out.done = p.is_done();
  out.keep_alive = out.done && p.keep_alive();
  if (p.is_header_done()) {
    out.status = p.status();
    out.content_type = p.content_type();
  }
  return out;
}

// The same bytes through Beast's response parser, all at once; `consumed`
// is how many it used.
Outcome read_one_with_beast(std::string_view bytes, std::size_t& consumed) {
  http::response_parser<http::string_body> p;
  p.header_limit(4096);
  p.body_limit(boost::none);
  p.eager(true);
  Outcome out;
  boost::beast::error_code ec;
  std::size_t fed = 0;
  while (!p.is_done() && fed < bytes.size()) {
    const std::size_t used = p.put(boost::asio::buffer(bytes.data() + fed, bytes.size() - fed), ec);
    fed += used;
    if (ec == http::error::need_more) {
      ec = {};
      if (used == 0)
        break;
      continue;
    }
    if (ec) {
      out.failed = true;
      return out;
    }
    if (used == 0)
      break;
  }
  if (!p.is_done() && p.got_some()) {
    p.put_eof(ec);
    out.failed = static_cast<bool>(ec);
  }
  out.done = p.is_done();
  out.keep_alive = out.done && p.keep_alive();
  if (p.is_header_done())
    out.status = p.get().result_int();
  if (out.done)
    out.body = p.get().body();
  consumed = fed;
  return out;
}

// Beast stops at an interim answer (1xx); the gateway's parser skips it
// and goes on to the final answer, so here each interim answer is read as
// a message of its own and the next one read after it.
Outcome read_with_beast(std::string_view bytes) {
  for (unsigned interim = 0;; ++interim) {
    std::size_t consumed = 0;
    Outcome out = read_one_with_beast(bytes, consumed);
    if (!out.done || out.failed || out.status / 100 != 1 || out.status == 101 ||
        interim == pdgate::EngineResponseParser::kMaxInterimAnswers)
      return out;
    bytes.remove_prefix(consumed);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2)
    return 0;
  const std::size_t piece = data[0] % 64 + 1;
  const std::size_t room = data[1] % 32 + 1;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  const Outcome whole = read(bytes, bytes.size() + 1, bytes.size() + 1);
  const Outcome split = read(bytes, piece, room);
  check(split.failed == whole.failed, "pieces changed whether it failed");
  check(split.done == whole.done, "pieces changed whether it completed");
  check(split.status == whole.status, "pieces changed the status");
  check(split.content_type == whole.content_type, "pieces changed the Content-Type");
  check(split.body == whole.body, "pieces or room changed the body");
  check(split.keep_alive == whole.keep_alive, "pieces changed keep-alive");
  if (whole.done && !whole.failed) {
    const Outcome beast = read_with_beast(bytes);
    check(beast.done && !beast.failed, "accepted an answer Beast's parser refuses");
    check(beast.status == whole.status, "a status other than Beast's");
    check(beast.body == whole.body, "a body other than Beast's");
    check(beast.keep_alive == whole.keep_alive, "keep-alive other than Beast's");
  }
  return 0;
}
