// One client connection: requests read one after another (keep-alive),
// each bounded in size, time and the memory its body may take, refused
// when it came back round, and dispatched through the route table. While a
// request is served the socket is watched, so that a client that leaves
// takes its upstream requests down with it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "core/config/config.hpp"
#include "core/gateway/access_log.hpp"
#include "core/gateway/routes.hpp"
#include "core/net/body_budget.hpp"
#include "core/net/loop_guard.hpp"
#include "core/net/tls_context.hpp"
#include "core/observability/metrics.hpp"
#include "core/pipeline/worker.hpp"

namespace pdgate {

// What a client connection needs from the gateway process; shared by all
// workers' connections. Its settings are the worker's (WorkerContext::cfg),
// which a reload replaces.
struct ClientSessionEnv {
  const RouteTable& routes;
  BodyBudget& body_budget;
  const LoopGuard& loop_guard;
  GatewayMetrics& metrics;
  std::atomic<std::int64_t>& active_requests;
  const std::atomic<bool>& stopping;
  // Null when --access-log is off.
  const std::unique_ptr<AccessLog>& access_log;
  // Null when the listener is plain HTTP (no --tls-cert).
  const std::unique_ptr<ListenerTls>& tls;
};

// Serves the connection until it closes, idles out, or the gateway stops.
// `peer` is the client's address, as accepted.
boost::asio::awaitable<void> serve_client(const ClientSessionEnv& env, WorkerContext& w,
                                          boost::asio::ip::tcp::socket socket,
                                          boost::asio::ip::tcp::endpoint peer);

}  // namespace pdgate
