// Requests the gateway sends to every instance at once on an operator's
// behalf: the aggregated GET /health and the profiler's start/stop.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <nlohmann/json.hpp>

#include "core/request_scope.hpp"
#include "core/worker.hpp"

namespace pdgate {

// One instance's answer to a fanned-out request.
struct FanOutReply {
  unsigned status = 0;  // 0: no answer (error says why)
  std::string body;
  std::string error;
};

// Sends one request to each instance concurrently and waits for all.
// Replies are in the order of `targets`. Bodies are bounded (1 MiB).
net::awaitable<std::vector<FanOutReply>> fan_out(WorkerContext& w,
                                                 const std::vector<InstancePtr>& targets,
                                                 http::verb method, std::string target,
                                                 std::string body, std::string authorization,
                                                 UpstreamTimeouts timeouts, RequestScope& scope);

// GET /health: every instance's /health, asked concurrently with a short
// timeout. Per role (encode, prefill, decode) "healthy" (at least one
// instance answered 2xx), "unhealthy" (none did) or "empty" (none
// configured). The status is 503 when a configured role is unhealthy.
// `extra` fields (e.g. the conversation store's state) are kept.
net::awaitable<std::pair<http::status, nlohmann::json>> aggregated_health(WorkerContext& w,
                                                                          const InstanceSet& set,
                                                                          nlohmann::json extra,
                                                                          RequestScope& scope);

// POST /start_profile or /stop_profile (`path`) sent to every instance of
// every role with the client's body. 404 (profiling off on that engine) is
// tolerated; 503 when every instance answered 404, 502 when any failed
// otherwise.
net::awaitable<std::pair<http::status, nlohmann::json>> profile_fan_out(
    WorkerContext& w, const InstanceSet& set, std::string path, std::string body,
    std::string authorization, RequestScope& scope);

}  // namespace pdgate
