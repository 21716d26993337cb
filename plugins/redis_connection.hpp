// One asynchronous Redis connection driven by a worker's event loop: an
// Asio stream (plain TCP, TLS for rediss://, or a unix socket) owns the
// socket, and hiredis's redisReader, a parser without I/O, reads RESP
// from the bytes it delivers. (Debian 12's hiredis 0.14 has no TLS, and
// its async API insists on owning the socket.)
//
// Commands are pipelined: concurrent callers on the same worker share the
// connection, hiredis writes their commands back to back and Redis answers
// in order. Every command has a bounded wait; a caller that gives up does
// not cancel the command (Redis may still run it), it just stops waiting.
// The connection reconnects by itself with exponential backoff, so a Redis
// that comes back is used again without restarting the gateway.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "core/net/tls_context.hpp"
#include "plugins/redis_client_context.hpp"
#include "plugins/redis_protocol.hpp"
#include "plugins/redis_sentinel.hpp"

namespace pdgate {

struct RedisConnectionSettings {
  RedisEndpoint endpoint;
  RedisClientContext context;
  std::chrono::milliseconds command_timeout{50};
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds reconnect_min{100};
  std::chrono::milliseconds reconnect_max{5000};
  // Beyond this many unanswered commands a new one fails at once instead
  // of queueing behind a Redis that does not answer (bounded memory).
  std::size_t max_in_flight = 4096;
};

// What the connections of one process share (they run on different
// threads, hence atomics).
struct RedisConnectionsShared {
  std::atomic<int> ready_connections{0};
};

class RedisConnection : public std::enable_shared_from_this<RedisConnection> {
 public:
  static std::shared_ptr<RedisConnection> create(net::any_io_executor ex,
                                                 RedisConnectionSettings settings,
                                                 RedisConnectionsShared& shared);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Subscriber mode; call before start(). After every (re)connect the
  // connection SUBSCRIBEs to `channel`; `on_subscribed` runs each time
  // Redis confirms the subscription (so the owner can catch up on what it
  // missed while disconnected) and `on_message` for every message
  // published on the channel. Both run on the connection's executor. A
  // subscriber connection takes no command().
  void subscribe(std::string channel, std::function<void(std::string_view)> on_message,
                 std::function<void()> on_subscribed);

  // Starts connecting (and reconnecting, until stop()).
  void start();
  // Closes the connection; pending commands complete with no reply, and
  // the subscription callbacks are never called again.
  void stop();

  bool ready() const { return ready_; }

  // Sends one command and waits for its reply at most command_timeout.
  // Never fails by exception: no reply (not connected, timed out,
  // disconnected) is a RedisReply of type none saying why. The arguments
  // are copied before the first suspension.
  net::awaitable<RedisReply> command(std::vector<std::string_view> args);

 private:
  // One connection's socket, parser and replies awaited (redis_connection.cpp).
  struct Link;
  RedisConnection(net::any_io_executor ex, RedisConnectionSettings settings,
                  RedisConnectionsShared& shared);
  static net::awaitable<void> run(std::shared_ptr<RedisConnection> self);
  net::awaitable<bool> connect_once(std::string& why);
  // redis+sentinel://: where the master is now, from the sentinels; then
  // a watch that drops the connection when the master moves.
  net::awaitable<bool> find_master(std::string& host, std::uint16_t& port, std::string& why);
  void watch_for_switch(const std::string& host, std::uint16_t port);
  net::awaitable<RedisReply> send(const std::vector<std::string_view>& args,
                                  std::chrono::milliseconds wait);
  // Opens the socket (and TLS) to host:port or the unix path, within the
  // connect deadline.
  net::awaitable<bool> open_link(const std::string& host, std::uint16_t port,
                                 std::chrono::steady_clock::time_point deadline, std::string& why);
  static net::awaitable<void> read_loop(std::shared_ptr<Link> link);
  // Writes what the link's commands gathered, unless a write is under
  // way (its end writes what gathered meanwhile: finish_write).
  void flush(const std::shared_ptr<Link>& link);
  static net::awaitable<void> finish_write(std::shared_ptr<Link> link,
                                           net::awaitable<boost::beast::error_code> rest);
  void on_reply(Link& link, RedisReply reply);
  // The link broke (read or write failed, bad bytes): dropped and counted.
  void link_failed(Link& link, RedisErrorKind kind, const std::string& why);
  void count(RedisErrorKind kind) {
    if (settings_.context.stats)
      settings_.context.stats->count(kind);
  }
  void drop(const std::string& why);
  void set_ready(bool r);
  void notify() { signal_.cancel(); }

  net::any_io_executor ex_;
  RedisConnectionSettings settings_;
  RedisConnectionsShared& shared_;
  std::shared_ptr<Link> link_;  // null: not connected
  bool ready_ = false;
  bool stopped_ = false;
  bool announced_down_ = false;
  bool ever_connected_ = false;
  // The first connection attempt has ended, made or failed: until then a
  // command waits for it (within its timeout) rather than fail at once.
  bool connect_settled_ = false;
  std::string last_error_;
  // Wakes the reconnect loop on connection state changes; also its sleep.
  net::steady_timer signal_;
  // redis+sentinel://: the sentinel that answered last (asked first next
  // time) and the watch on it while connected.
  std::size_t sentinel_preferred_ = 0;
  std::shared_ptr<SentinelWatch> switch_watch_;
  // Subscriber mode (empty channel: a command connection).
  std::string channel_;
  std::function<void(std::string_view)> on_message_;
  std::function<void()> on_subscribed_;
};

}  // namespace pdgate
