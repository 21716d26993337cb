// Active health checks and the small one-shot HTTP GET they (and the
// admin API's /v1/models validation) use. Runs on the control loop, never
// on a worker's: a slow engine cannot stall client traffic.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "core/config/config.hpp"
#include "core/net/loop_guard.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

struct EngineTls;

struct ProbeResult {
  unsigned status = 0;  // 0: no HTTP answer (see error)
  std::string body;
  std::string error;
  // The gateway could not even open a socket (out of file descriptors or
  // memory): says nothing about the engine.
  bool local = false;
};

// GET http://host:port/target on a fresh connection, the whole exchange
// (TLS handshake included) bounded by `timeout`; the body is capped at
// `body_limit`. `via` (when set) is sent as the Via header, so that a gateway
// probing itself is told so (508, core/net/loop_guard.hpp). With `tls`, the
// GET goes over https:// with it.
boost::asio::awaitable<ProbeResult> probe_get(boost::asio::any_io_executor ex, std::string host,
                                              std::uint16_t port, std::string target,
                                              std::chrono::milliseconds timeout,
                                              std::string via = {}, const EngineTls* tls = nullptr,
                                              std::size_t body_limit = 1u << 20);

// Checks every instance's /health each interval (when on), at most
// --health-max-concurrency at a time, each at its own offset into the
// interval (core/upstream/probe_rounds.hpp; the first round as soon as slots allow);
// applies rise/fall, re-admits ejected instances whose back-off passed when
// checks are off, and forgets removed instances once idle. Runs until the
// executor stops, which must be run by one thread.
// `tls` reaches https:// instances.
boost::asio::awaitable<void> run_health_loop(const Config& cfg, Registry& registry,
                                             const LoopGuard& loop_guard,
                                             std::shared_ptr<const EngineTls> tls);

}  // namespace pdgate
