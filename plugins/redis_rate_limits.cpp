#include "plugins/redis_rate_limits.hpp"

#include <cstdio>
#include <random>

#include <spdlog/spdlog.h>

#include "core/base/warn_limiter.hpp"
#include "plugins/redis_connection.hpp"
#include "plugins/redis_script.hpp"

namespace pdgate {

namespace {

// KEYS: one sorted set per limit, the times (ms) of the events in its
// window. ARGV[1]: '1' to count, '0' to judge only (explain); ARGV[2]:
// this event's name (unique per limiter and request; its member in the
// i-th set is NAME:i, so two limits on one key count twice, as the
// replica's store does); then each limit's
// limit and window in ms.
// Returns {1 if every limit fits else 0, then per limit: the events in
// its window (this one included when counted), and 0 when it fits or
// else the ms until the event that must leave for one more to fit does
// (the limit-th newest: a lowered limit counts only the newest)}. An event
// at `now - window` has left, as in the replica's own store.
constexpr const char* kCheckScript = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local count = ARGV[1] == '1'
local out = {1}
for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[1 + 2 * i])
  local window = tonumber(ARGV[2 + 2 * i])
  local since = now - window
  if count then redis.call('ZREMRANGEBYSCORE', key, '-inf', since) end
  local n = redis.call('ZCOUNT', key, '(' .. since, '+inf')
  local wait = 0
  if n >= limit then
    local oldest = redis.call('ZREVRANGEBYSCORE', key, '+inf', '(' .. since,
                              'WITHSCORES', 'LIMIT', limit - 1, 1)
    wait = math.max(1, math.min(window, tonumber(oldest[2]) + window - now))
    out[1] = 0
  end
  out[2 * i] = n
  out[2 * i + 1] = wait
end
if count and out[1] == 1 then
  for i, key in ipairs(KEYS) do
    redis.call('ZADD', key, now, ARGV[2] .. ':' .. i)
    redis.call('PEXPIRE', key, tonumber(ARGV[2 + 2 * i]))
    out[2 * i] = out[2 * i] + 1
  end
end
return out
)lua";

class RedisRateLimits;

class RedisRateLimiter final : public RateLimiter {
 public:
  RedisRateLimiter(RedisRateLimits& owner, boost::asio::any_io_executor ex);
  ~RedisRateLimiter() override { conn_->stop(); }
  boost::asio::awaitable<RateLimitVerdict> check(std::span<const RateLimitDecl> limits,
                                                 bool count) override;

 private:
  RedisRateLimits& owner_;
  std::shared_ptr<RedisConnection> conn_;
  std::string nonce_;
  std::uint64_t next_event_ = 0;
};

class RedisRateLimits final : public RateLimits {
 public:
  RedisRateLimits(RedisRateLimitsOptions options, RedisConnectionSettings settings,
                  LocalRateCheck local)
      : options_(std::move(options)),
        settings_(std::move(settings)),
        local_(std::move(local)),
        script_(kCheckScript) {}
  std::unique_ptr<RateLimiter> make_limiter(boost::asio::any_io_executor ex) override {
    return std::make_unique<RedisRateLimiter>(*this, std::move(ex));
  }
  const RedisRateLimitsOptions& options() const { return options_; }
  const RedisConnectionSettings& settings() const { return settings_; }
  RedisConnectionsShared& connections() { return connections_; }
  const LocalRateCheck& local() const { return local_; }
  const RedisScript& script() const { return script_; }
  // Every worker's fallbacks said together, at most every 30 s.
  WarnLimiter& warn() { return warn_; }

 private:
  RedisRateLimitsOptions options_;
  RedisConnectionSettings settings_;
  RedisConnectionsShared connections_;
  LocalRateCheck local_;
  RedisScript script_;
  WarnLimiter warn_{std::chrono::seconds(30)};
};

std::string random_nonce() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

RedisRateLimiter::RedisRateLimiter(RedisRateLimits& owner, boost::asio::any_io_executor ex)
    : owner_(owner),
      conn_(RedisConnection::create(std::move(ex), owner.settings(), owner.connections())),
      nonce_(random_nonce()) {
  conn_->start();
}

boost::asio::awaitable<RateLimitVerdict> RedisRateLimiter::check(
    std::span<const RateLimitDecl> limits, bool count) {
  const std::vector<RateLimitDecl> held(limits.begin(), limits.end());
  std::vector<std::string> keys, args;
  keys.reserve(held.size());
  args.reserve(2 + 2 * held.size());
  args.push_back(count ? "1" : "0");
  args.push_back(nonce_ + ":" + std::to_string(++next_event_));
  for (const RateLimitDecl& l : held) {
    keys.push_back(rate_limit_redis_key(owner_.options().key_prefix, l.key));
    args.push_back(std::to_string(l.limit));
    args.push_back(std::to_string(l.window_ms));
  }
  // The connection (and the owner) outlive the call: the limiter is
  // destroyed with its worker's loop, after its coroutines.
  const RedisReply r = co_await run_script(*conn_, owner_.script(), keys, args);
  RateLimitCounters* c = count ? &owner_.counters() : nullptr;
  if (auto answers = interpret_rate_limit_reply(r, held)) {
    RateLimitVerdict v;
    v.answers = std::move(*answers);
    v.cluster = true;
    if (c != nullptr)
      (v.allowed() ? c->cluster_allowed : c->cluster_limited)
          .fetch_add(1, std::memory_order_relaxed);
    co_return v;
  }
  // No verdict from Redis: this replica's own store judges.
  std::string why = r.type == RedisReply::Type::none    ? "no reply: " + r.text
                    : r.type == RedisReply::Type::error ? "error reply: " + r.text
                                                        : "a reply that is no verdict";
  if (why.size() > 200)
    why.resize(200);
  std::uint64_t held_back = 0;
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  if (owner_.warn().allow(now_ms, held_back))
    spdlog::warn("policy rate limits checked on this replica only: redis gave {} ({} more since)",
                 why, held_back);
  if (c != nullptr)
    c->fallbacks.fetch_add(1, std::memory_order_relaxed);
  RateLimitVerdict v = check_locally(owner_.local(), held, count, c);
  v.fallback = std::move(why);
  co_return v;
}

}  // namespace

std::string rate_limit_redis_key(std::string_view prefix, std::string_view key) {
  std::string k;
  k.reserve(prefix.size() + 12 + key.size());
  k.append(prefix).append("policy_rate:").append(key);
  return k;
}

Result<std::unique_ptr<RateLimits>> make_redis_rate_limits(RedisRateLimitsOptions options,
                                                           LocalRateCheck local) {
  auto settings = script_connection_settings(options.redis_url, options.redis, options.timeout);
  if (!settings)
    return fail(settings.error());
  return std::unique_ptr<RateLimits>(std::make_unique<RedisRateLimits>(
      std::move(options), std::move(*settings), std::move(local)));
}

}  // namespace pdgate
