// Talking to Redis Sentinel (redis+sentinel:// endpoints): asking where a
// master is, and hearing when it moves. Each exchange uses a short-lived
// socket of its own with plain RESP (redis_protocol.hpp has the pure
// parts), so the sentinels never share a connection with the data path.
//
// Why both: a RedisConnection asks at every (re)connect, which follows a
// master that died (its connections break) and one that was demoted
// (Sentinel kills the demoted server's client connections, and a write
// that still reaches it answers READONLY). The +switch-master watch makes
// the switch at once in the cases where the old master neither closes nor
// answers (a partition), instead of after the stall detector's delay.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "core/base/result.hpp"
#include "core/net/tls_context.hpp"
#include "plugins/redis_protocol.hpp"

namespace pdgate {

namespace net = boost::asio;

// The master's address as the first sentinel that knows it says, trying
// the sentinels in order from `preferred` (the last one that answered; it
// is updated). Each sentinel gets at most `per_sentinel` to answer,
// connecting and (rediss+sentinel://, with `tls`) the TLS handshake
// included.
net::awaitable<Result<SentinelAddress>> ask_sentinels_for_master(
    net::any_io_executor ex, const RedisEndpoint& ep, const EngineTls* tls, std::size_t& preferred,
    std::chrono::milliseconds per_sentinel);

// A running +switch-master subscription (watch_master_switch).
class SentinelWatch {
 public:
  virtual ~SentinelWatch() = default;
  // Closes the socket: the watch ends soon after, without calling back.
  virtual void cancel() = 0;
};
// Subscribes to +switch-master on sentinel `index` of `ep`, on `ex`, and
// calls `on_switch` (on `ex`) with the new address whenever `ep`'s master
// moves, until the sentinel connection breaks or the watch is cancelled.
std::shared_ptr<SentinelWatch> watch_master_switch(
    net::any_io_executor ex, const RedisEndpoint& ep, const EngineTls* tls, std::size_t index,
    std::chrono::milliseconds connect_timeout,
    std::function<void(const SentinelAddress&)> on_switch);

}  // namespace pdgate
