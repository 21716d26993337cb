// The sans-I/O half of the Redis conversation store: what the URL means,
// what a reply means, how long to wait before reconnecting, when to warn.
// All pure and unit-tested without a socket (tests/plugins); the hiredis
// and Asio half lives in redis_connection.{hpp,cpp}.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/result.hpp"
#include "core/base/warn_limiter.hpp"
#include "core/routing/conversation_store.hpp"
#include "core/routing/request_hook.hpp"

struct redisReply;  // hiredis
struct redisReader;

namespace pdgate {

// More sentinels than this in one URL is a mistake, not a deployment.
inline constexpr std::size_t kMaxSentinels = 16;

// A Redis Sentinel, asked where the master is (redis+sentinel:// URLs).
struct SentinelAddress {
  std::string host;  // a name or an address (IPv6 without brackets)
  std::uint16_t port = 26379;
};

struct RedisEndpoint {
  bool is_unix = false;
  std::string host;  // TCP: a name or an address (IPv6 without brackets)
  std::uint16_t port = 6379;
  // redis+sentinel://: the sentinels to ask, and the name of the master
  // they watch. host/port are then learnt, at every (re)connect, from the
  // first sentinel that knows the master.
  std::vector<SentinelAddress> sentinels;
  std::string master_name;
  std::string sentinel_password;  // AUTH for the sentinels (?sentinel_password=)
  std::string path;               // unix socket path
  std::string username;           // Redis 6 ACL user; empty: AUTH with the password only
  std::string password;           // empty: no AUTH
  int db = 0;                     // SELECT when not 0
  // rediss:// and rediss+sentinel://: TLS to the server (and the
  // sentinels), its certificate checked against --redis-tls-ca and the
  // host of the URL (or the address a sentinel names).
  bool tls = false;

  bool is_sentinel() const { return !sentinels.empty(); }
  // The URL without the password, for logs and /health.
  std::string display() const;
};

// redis://[[user]:password@]host[:port][/db]  (host may be [v6addr])
// unix:///path/to/socket[?db=N][&password=P][&user=U]
// redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master[/db]
//   [?sentinel_password=P]  (the password is the master's; sentinels listen
//   on 26379 unless a port is given)
// rediss:// and rediss+sentinel:// are the same over TLS.
// Percent-escapes in user and password are decoded.
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

// No reply at all, saying why (a timeout, a lost connection).
inline RedisReply no_reply(std::string why) {
  RedisReply r;
  r.text = std::move(why);
  return r;
}

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

// Takes the next whole reply out of `reader` (fed with the bytes read so
// far) into `out`: `reply`, `need_more` when it holds no whole reply yet,
// `error` (out's text says why) when the bytes are not RESP or pass the
// bounds.
enum class ReaderStatus { reply, need_more, error };
ReaderStatus next_reply(redisReader* reader, RedisReply& out);

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

// The policy rate-limit script's reply (plugins/redis_rate_limits.cpp)
// for `limits`: an array of 1 + 2 * limits.size() integers, whether all
// fit (1) or not (0), then for each limit its count (0..limit, 1 more
// when counted) and its wait in ms (0 when it fits, else 1..its window).
// The per-limit answers, or nothing when the reply is anything else (an
// error, another shape, numbers out of range, a verdict that contradicts
// its parts): the caller then judges on this replica.
std::optional<std::vector<RateLimitAnswer>> interpret_rate_limit_reply(
    const RedisReply& reply, const std::vector<RateLimitDecl>& limits);

// Redis Sentinel (redis+sentinel:// endpoints). The connection asks the
// sentinels with plain RESP over a socket of its own; these are the pure
// parts, unit-tested without servers.

// A command as RESP bytes (an array of bulk strings).
std::string resp_command(const std::vector<std::string_view>& args);
// The same, appended to `out` (a connection's pipeline of commands).
void append_resp_command(std::string& out, const std::vector<std::string_view>& args);

// SENTINEL get-master-addr-by-name: [host, port], or nil when the sentinel
// does not know that master.
Result<SentinelAddress> interpret_master_address(const RedisReply& reply);

// ROLE: true when the first element is "master". A client that reached a
// replica (a failover in progress, a stale sentinel) must not write to it.
bool is_master_role(const RedisReply& reply);

// "READONLY You can't write against a read only replica.": the server this
// connection knew as the master was turned into a replica.
bool is_readonly_error(const RedisReply& reply);

// A +switch-master message ("<name> <old-ip> <old-port> <new-ip>
// <new-port>") for `master_name`: the new address; nullopt for another
// master's or a malformed message.
std::optional<SentinelAddress> switch_master_target(std::string_view message,
                                                    std::string_view master_name);

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
