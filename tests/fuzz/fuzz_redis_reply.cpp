// The Redis reply path as pdgate runs it: bytes from the server go through
// hiredis's reply reader, are taken and copied out (plugins/redis_protocol.cpp
// next_reply, copy_reply), judged (interpret_take_reply, interpret_put_reply, the
// policies' rate-limit verdict, and the Sentinel answers: master address, ROLE, +switch-master),
// and a taken value is decoded as a stored turn (core/routing/turn_history.cpp). The first byte
// picks how the bytes are split across reads: split or whole, the replies and the protocol error
// must be the same.
#include <hiredis/hiredis.h>

#include <hiredis/read.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/routing/turn_history.hpp"
#include "plugins/redis_protocol.hpp"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant failed: %s\n", what);
    std::abort();
  }
}

bool same(const pdgate::RedisReply& a, const pdgate::RedisReply& b) {
  if (a.type != b.type || a.text != b.text || a.integer != b.integer ||
      a.elements.size() != b.elements.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.elements.size(); ++i) {
    if (!same(a.elements[i], b.elements[i]))
      return false;
  }
  return true;
}

struct Parsed {
  std::vector<pdgate::RedisReply> replies;
  bool protocol_error = false;
};

// Feeds `bytes` in pieces of `piece` bytes, taking every reply as soon as
// it is complete, as the connection does.
Parsed parse(std::string_view bytes, std::size_t piece) {
  Parsed out;
  redisReader* r = redisReaderCreate();
  pdgate::bound_reply_reader(r);  // as every connection's reader is
  for (std::size_t at = 0; at < bytes.size() && !out.protocol_error; at += piece) {
    const auto chunk = bytes.substr(at, piece);
    if (redisReaderFeed(r, chunk.data(), chunk.size()) != REDIS_OK) {
      out.protocol_error = true;
      break;
    }
    // As the connection and the sentinel client take them (next_reply).
    for (;;) {
      pdgate::RedisReply reply;
      const pdgate::ReaderStatus got = pdgate::next_reply(r, reply);
      if (got == pdgate::ReaderStatus::error)
        out.protocol_error = true;
      if (got != pdgate::ReaderStatus::reply)
        break;
      out.replies.push_back(std::move(reply));
    }
  }
  redisReaderFree(r);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0)
    return 0;
  const std::size_t piece = data[0] % 7 + 1;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Parsed whole = parse(bytes, bytes.size() + 1);
  const Parsed split = parse(bytes, piece);
  check(whole.protocol_error == split.protocol_error, "protocol error depends on the split");
  if (!whole.protocol_error) {
    check(whole.replies.size() == split.replies.size(), "reply count depends on the split");
    for (std::size_t i = 0; i < whole.replies.size(); ++i)
      check(same(whole.replies[i], split.replies[i]), "reply depends on the split");
  }
  for (const auto& reply : whole.replies) {
    const auto taken = pdgate::interpret_take_reply(reply);
    check(taken.kind != pdgate::TakeResult::Kind::hit ||
              reply.type == pdgate::RedisReply::Type::string,
          "a hit that was not a bulk string");
    if (taken.kind == pdgate::TakeResult::Kind::hit) {
      // Whatever a store holds (or an attacker wrote into it) decodes to a
      // turn that re-encodes to a value that decodes the same, or to none.
      if (auto turn = pdgate::decode_stored_turn(taken.params)) {
        auto again = pdgate::decode_stored_turn(pdgate::encode_stored_turn(*turn));
        check(again.has_value(), "a decoded turn does not re-encode");
        check(again->fingerprint == turn->fingerprint && again->extent == turn->extent &&
                  again->kind == turn->kind,
              "a decoded turn re-encodes differently");
      }
    }
    (void)pdgate::interpret_put_reply(reply);
    // The policies' rate-limit verdict (plugins/redis_rate_limits.cpp): a
    // reply read as one has an answer per limit, each within its limit
    // and window, refused exactly when it has a wait.
    static const std::vector<pdgate::RateLimitDecl> kLimits = {{"a", 1, 1, ""},
                                                               {"b", 100000, 31536000000, ""}};
    for (std::size_t n = 0; n <= kLimits.size(); ++n) {
      const std::vector<pdgate::RateLimitDecl> limits(kLimits.begin(), kLimits.begin() + n);
      if (auto v = pdgate::interpret_rate_limit_reply(reply, limits)) {
        check(v->size() == n, "an answer per limit");
        for (std::size_t i = 0; i < n; ++i) {
          const auto& a = (*v)[i];
          check(a.allowed == (a.retry_after_ms == 0), "refused exactly when it waits");
          check(a.retry_after_ms >= 0 && a.retry_after_ms <= limits[i].window_ms,
                "a wait within the window");
          check(a.count >= 0 && a.count <= pdgate::kMaxRateLimitEvents + 1, "a count in range");
          check(!a.allowed || a.count <= limits[i].limit, "room within the limit");
        }
      }
    }
    (void)pdgate::is_unknown_command_error(reply);
    // What a sentinel answers (redis+sentinel:// endpoints): a master's
    // address is never empty, and a +switch-master message's target never
    // has port 0.
    if (auto master = pdgate::interpret_master_address(reply))
      check(!master->host.empty() && master->port != 0, "a master without an address");
    (void)pdgate::is_master_role(reply);
    (void)pdgate::is_readonly_error(reply);
    if (reply.type == pdgate::RedisReply::Type::array && reply.elements.size() == 3) {
      if (auto to = pdgate::switch_master_target(reply.elements[2].text, reply.elements[1].text))
        check(to->port != 0, "a switch to port 0");
    }
  }
  return 0;
}
