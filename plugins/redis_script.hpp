// A Lua script run on Redis by its SHA-1 (EVALSHA), sent whole (EVAL)
// once when the server does not have it yet (a restarted or failed-over
// Redis), which then caches it: what the API-key limits
// (redis_client_keys.cpp) and the policies' rate limits
// (redis_rate_limits.cpp) run on every request.
#pragma once

#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "core/base/result.hpp"
#include "plugins/redis_connection.hpp"

namespace pdgate {

struct RedisScript {
  explicit RedisScript(const char* text);
  std::string text;
  std::string sha;  // hex SHA-1 of the text, as Redis names it
};

// Runs `script` on `conn` with `keys` and `args`; the reply as
// RedisConnection::command gives it (no reply: timeout, not connected).
boost::asio::awaitable<RedisReply> run_script(RedisConnection& conn, const RedisScript& script,
                                              const std::vector<std::string>& keys,
                                              const std::vector<std::string>& args);

// The settings of the connections that run such scripts on the request
// path: `url` parsed (an error names what is wrong with it), the owner's
// context, and `timeout` (--redis-timeout) on every command.
Result<RedisConnectionSettings> script_connection_settings(const std::string& url,
                                                           const RedisClientContext& context,
                                                           std::chrono::milliseconds timeout);

}  // namespace pdgate
