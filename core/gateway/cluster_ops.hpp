// Requests the gateway sends to every instance at once on an operator's
// behalf: the profiler's start/stop.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <nlohmann/json.hpp>

#include "core/net/request_scope.hpp"
#include "core/pipeline/forwarded_headers.hpp"
#include "core/pipeline/worker.hpp"

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
                                                 std::string body, const ForwardedHeaders& fwd,
                                                 UpstreamTimeouts timeouts, RequestScope& scope);

// POST /start_profile or /stop_profile (`path`) sent to every instance of
// every role with the client's body. 404 (profiling off on that engine) is
// tolerated; 503 when every instance answered 404, 502 when any failed
// otherwise.
net::awaitable<std::pair<http::status, nlohmann::json>> profile_fan_out(
    WorkerContext& w, const InstanceSet& set, std::string path, std::string body,
    const ForwardedHeaders& fwd, RequestScope& scope);

}  // namespace pdgate
