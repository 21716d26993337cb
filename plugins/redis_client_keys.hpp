// API-key limits shared by every replica through Redis, and keys kept in
// Redis (core/pipeline/client_keys.hpp has the interface and the local version).
//
// One Lua script per request does the whole check atomically on Redis's
// clock: the tokens-per-minute window, the GCRA rate bucket and the
// concurrency set (a sorted set of slots with a lease, so a replica that
// dies with requests in flight frees its slots after the lease). It is one
// EVALSHA on the worker's own connection, pipelined with everything else
// that worker sends. The release (slot back, tokens counted) is a second
// script sent without waiting for its answer.
//
// Keys: the hash <prefix>api_keys maps the hex SHA-256 of a key to its
// JSON ({"name", "labels", "requests_per_second", "burst", "concurrent",
// "tokens_per_minute"}), read every 5 s on the control thread; lookups
// stay local.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/base/result.hpp"
#include "core/pipeline/client_keys.hpp"
#include "plugins/redis_client_context.hpp"

namespace pdgate {

struct RedisClientKeysOptions {
  std::string redis_url;
  RedisClientContext redis;  // rediss://'s TLS, the connections' counters
  std::string key_prefix = "pdgate:";
  std::chrono::milliseconds timeout{50};
  bool keys_from_redis = false;
  bool fail_open = true;
  // A concurrency slot not released within this is freed (its replica died).
  std::chrono::milliseconds slot_lease{std::chrono::minutes(15)};
  std::chrono::milliseconds refresh_interval{std::chrono::seconds(5)};
};

Result<std::unique_ptr<ClientKeys>> make_redis_client_keys(KeyTable file_keys,
                                                           RedisClientKeysOptions options);

// The admit script's keys for `name` under `prefix` (rate, slots, tokens
// window prefix), for tests and operators reading Redis.
std::string client_limit_key(std::string_view prefix, std::string_view name,
                             std::string_view which);

}  // namespace pdgate
