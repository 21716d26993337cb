// An engine's answer as the exchange reads it (core/upstream.cpp with
// core/engine_response_parser.hpp): the bytes arrive in pieces into one
// buffer, each parse writes body bytes into a room the caller lends, and
// the connection's end is told to the parser once. The first byte picks
// the piece size, the second the room; the rest is the answer.
//
// Invariants beyond "no crash": neither the piece size nor the room
// changes the outcome (status, Content-Type, whether it completed, the
// body), and a parse never writes past the room it was lent.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/engine_response_parser.hpp"

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
  if (p.is_header_done()) {
    out.status = p.status();
    out.content_type = p.content_type();
  }
  return out;
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
  return 0;
}
