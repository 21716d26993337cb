// The sans-I/O half of the Redis conversation store: what the URL means,
// what a reply means, how long to wait before reconnecting, when to warn.
// All pure and unit-tested without a socket (tests/plugins); the hiredis
// and Asio half lives in redis_connection.{hpp,cpp}.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/conversation_store.hpp"
#include "core/result.hpp"
#include "core/warn_limiter.hpp"

struct redisReply;  // hiredis
struct redisReader;

namespace pdgate {

struct RedisEndpoint {
  bool is_unix = false;
  std::string host;  // TCP: a name or an address (IPv6 without brackets)
  std::uint16_t port = 6379;
  std::string path;      // unix socket path
  std::string username;  // Redis 6 ACL user; empty: AUTH with the password only
  std::string password;  // empty: no AUTH
  int db = 0;            // SELECT when not 0

  // The URL without the password, for logs and /health.
  std::string display() const;
};

// redis://[[user]:password@]host[:port][/db]  (host may be [v6addr])
// unix:///path/to/socket[?db=N][&password=P][&user=U]
// Percent-escapes in user and password are decoded. rediss:// (TLS) is
// refused with a message rather than silently sent in clear text.
Result<RedisEndpoint> parse_redis_url(std::string_view url);

// A reply copied out of hiredis (whose reply objects die with the
// callback), reduced to what the store looks at.
struct RedisReply {
  enum class Type { string, array, integer, nil, status, error, none };
  // `none`: no reply at all (timeout, disconnected, not connected); `text`
  // then says why.
  Type type = Type::none;
  std::string text;
  long long integer = 0;
  std::vector<RedisReply> elements;  // of an array (e.g. a pub/sub message)
};

// Limits on what a Redis server's replies may make pdgate hold. pdgate's
// own replies are small (a stored turn is a few hundred bytes, the shared
// registry's document about 150 bytes per instance): these only stop a
// broken or hostile server. hiredis (0.14) trusts a reply's declared
// array length and allocates for it at once ("*1000000000" = 8 GB), and
// buffers a bulk string until it is whole.
inline constexpr int kMaxReplyElements = 1 << 20;
inline constexpr std::size_t kMaxReplyBytes = 256u << 20;

// Makes `reader` refuse (as a protocol error) arrays longer than
// kMaxReplyElements and strings longer than kMaxReplyBytes, before
// allocating for them.
void bound_reply_reader(redisReader* reader);

// Copies a hiredis reply (which dies with its callback) into a RedisReply:
// bulk strings, status and error text, integers, nil, and arrays (nested
// as deep as hiredis parsed them).
RedisReply copy_reply(const redisReply* r);

// GETDEL (or the GET+DEL script): nil is a miss, a bulk string is a hit,
// anything else is an error (an error reply, a wrong type, no reply).
TakeResult interpret_take_reply(const RedisReply& reply);

// SET ... EX: the status "OK" is success; anything else is a failure.
bool interpret_put_reply(const RedisReply& reply);

// True when the server does not know GETDEL (Redis < 6.2): the store then
// falls back to an atomic GET+DEL script.
bool is_unknown_command_error(const RedisReply& reply);

// `<prefix>conv:<id>`.
std::string conversation_redis_key(std::string_view prefix, std::string_view conversation_id);

// Exponential reconnect delay: min, 2*min, ... capped at max; reset() after
// a connection became usable.
class Backoff {
 public:
  Backoff(std::chrono::milliseconds min, std::chrono::milliseconds max) : min_(min), max_(max) {}
  std::chrono::milliseconds next();
  void reset() { attempts_ = 0; }

 private:
  std::chrono::milliseconds min_, max_;
  unsigned attempts_ = 0;
};

}  // namespace pdgate
