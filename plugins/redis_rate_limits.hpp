// The policies' declared rate limits (req:rate_limit) judged on Redis, so
// that a limit holds for every replica together (core/pipeline/
// rate_limit_phase.hpp has the interface and the per-replica version).
//
// One Lua script call per request judges every limit the request declared
// and counts it under each only when all let it in, atomically, on
// Redis's clock (TIME), so replicas' clocks do not matter. A limit's key,
// <prefix>policy_rate:<key>, is a sorted set of the events in its window
// (scored by their time in ms), trimmed as it is read and expiring one
// window after its last event: it holds at most `limit` members, and
// nothing is left behind by keys no longer used.
//
// Redis down, slow (no answer within --redis-timeout) or answering
// anything but a verdict: the replica's own store judges instead (counted
// in pdgate_policy_rate_limit_fallbacks_total), and the request is never
// failed for it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/base/result.hpp"
#include "core/pipeline/rate_limit_phase.hpp"
#include "plugins/redis_client_context.hpp"

namespace pdgate {

struct RedisRateLimitsOptions {
  std::string redis_url;
  RedisClientContext redis;  // rediss://'s TLS, the connections' counters
  std::string key_prefix = "pdgate:";
  std::chrono::milliseconds timeout{50};
};

Result<std::unique_ptr<RateLimits>> make_redis_rate_limits(RedisRateLimitsOptions options,
                                                           LocalRateCheck local);

// The Redis key of a declared limit's `key` under `prefix`.
std::string rate_limit_redis_key(std::string_view prefix, std::string_view key);

}  // namespace pdgate
