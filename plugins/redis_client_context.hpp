// What the Redis connections of one owner (the conversation store, the
// shared registry, ...) share besides the URL: the TLS context rediss://
// connects with, and where their state is counted for /metrics
// (pdgate_redis_connected, _reconnects_total, _errors_total). Kept apart
// from redis_connection.hpp so that the owners' headers need not see
// Asio's or OpenSSL's.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace pdgate {

class EngineTls;
class PrometheusText;

// Why a connection failed or was replaced, as pdgate_redis_errors_total's
// kind label says it.
enum class RedisErrorKind {
  connect,    // resolving, connecting, or the connect deadline passed
  tls,        // the TLS handshake (a certificate refused, say)
  handshake,  // AUTH, SELECT, PING or ROLE refused
  timeout,    // a command got no reply in time
  closed,     // the server closed the connection, or reading failed
  protocol,   // bytes that are not RESP, or a reply past the bounds
  count
};
std::string_view to_string(RedisErrorKind k);

// The state of one owner's connections (the conversation store's, the
// shared registry's...), counted for /metrics. Shared by connections on
// several threads, hence atomics.
struct RedisConnectionStats {
  std::atomic<std::int64_t> connected{0};  // connections usable now
  // Connections made again after one was lost.
  std::atomic<std::uint64_t> reconnects{0};
  std::atomic<std::uint64_t> errors[static_cast<int>(RedisErrorKind::count)]{};
  void count(RedisErrorKind k) {
    errors[static_cast<int>(k)].fetch_add(1, std::memory_order_relaxed);
  }
};

// pdgate_redis_connected{role}, pdgate_redis_reconnects_total{role} and
// pdgate_redis_errors_total{role,kind}, one role per owner.
struct RedisStatsRow {
  std::string_view role;
  const RedisConnectionStats* stats;
};
void write_redis_metrics(PrometheusText& m, const std::vector<RedisStatsRow>& rows);

// What every connection of an owner shares besides the URL: the TLS
// context of rediss:// (--redis-tls-*, made once by main; null: a
// rediss:// URL fails to connect, saying so) and where its state is
// counted (null: not counted).
struct RedisClientContext {
  std::shared_ptr<const EngineTls> tls;
  std::shared_ptr<RedisConnectionStats> stats;
};

}  // namespace pdgate
