#include "plugins/redis_client_keys.hpp"

#include <atomic>
#include <cstdio>
#include <random>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "core/base/warn_limiter.hpp"
#include "plugins/redis_connection.hpp"
#include "plugins/redis_key_hash.hpp"
#include "plugins/redis_script.hpp"

namespace pdgate {

namespace {

// KEYS: rate (GCRA tat), slots (sorted set), tokens (hash: second ->
// tokens used in it, TokenWindow's buckets), reserved (hash: slot ->
// "tokens|deadline ms").
// ARGV: per second, bucket, concurrent, tokens per minute, slot, lease ms,
// tokens to reserve.
// Returns {1, 0, ""} or {0, retry after ms, "rate"|"concurrency"|"tokens"}.
// Time is Redis's own (TIME), so every replica is judged on one clock.
// The tokens rule is tokens_fit()'s and the window TokenWindow's
// (core/pipeline/client_keys.hpp): buckets of one second, each counted for
// 61 s, the wait until enough of them leave. Buckets out of the window, or
// not numbers (the hash is not trusted), are deleted as they are read;
// reservations of a replica that died expire with the slot lease.
constexpr const char* kAdmitScript = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local rps, bucket = tonumber(ARGV[1]), tonumber(ARGV[2])
local conc, tpm = tonumber(ARGV[3]), tonumber(ARGV[4])
local lease = tonumber(ARGV[6])
local reserve = tonumber(ARGV[7])
if tpm > 0 then
  local oldest = math.floor(now / 1000) - 60
  local used, buckets = 0, {}
  local window = redis.call('HGETALL', KEYS[3])
  for i = 1, #window, 2 do
    local second = tonumber(string.match(window[i], '^%d+$'))
    local n = tonumber(string.match(window[i + 1], '^%d+$'))
    if second == nil or n == nil or second < oldest then
      redis.call('HDEL', KEYS[3], window[i])
    else
      used = used + n
      buckets[#buckets + 1] = {second, n}
    end
  end
  if used >= tpm then
    table.sort(buckets, function(a, b) return a[1] < b[1] end)
    local wait = 1000
    for _, b in ipairs(buckets) do
      used = used - b[2]
      if used < tpm then
        wait = (b[1] + 61) * 1000 - now
        break
      end
    end
    return {0, math.ceil(wait), 'tokens'}
  end
  local held = 0
  local all = redis.call('HGETALL', KEYS[4])
  for i = 1, #all, 2 do
    local n, deadline = string.match(all[i + 1], '^(%d+)|(%d+)$')
    if n == nil or tonumber(deadline) < now then
      redis.call('HDEL', KEYS[4], all[i])
    else
      held = held + tonumber(n)
    end
  end
  if held > 0 and used + held + reserve > tpm then return {0, 1000, 'tokens'} end
end
local tat = 0
if rps > 0 then
  local interval = 1000 / rps
  tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
  local allow_at = tat + interval - bucket * interval
  if allow_at > now then return {0, math.ceil(allow_at - now), 'rate'} end
  tat = tat + interval
end
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - lease)
  if redis.call('ZCARD', KEYS[2]) >= conc then return {0, 1000, 'concurrency'} end
  redis.call('ZADD', KEYS[2], now, ARGV[5])
  redis.call('PEXPIRE', KEYS[2], lease)
end
if rps > 0 then
  redis.call('SET', KEYS[1], string.format('%.3f', tat), 'PX',
             math.ceil(bucket * 1000 / rps) + 1000)
end
if tpm > 0 and ARGV[5] ~= '' then
  redis.call('HSET', KEYS[4], ARGV[5], string.format('%d|%d', reserve, now + lease))
  redis.call('PEXPIRE', KEYS[4], lease)
end
return {1, 0, ''}
)lua";

// KEYS: slots, tokens (the window's hash), reserved. ARGV: slot ('' when
// none), tokens used. The tokens go into the bucket of Redis's current
// second; the hash lives as long as its newest bucket counts, and is
// trimmed when it holds more than the window's 61 buckets (plus a few, so
// that most releases skip the trim), so it stays bounded however long no
// request is admitted.
constexpr const char* kReleaseScript = R"lua(
if ARGV[1] ~= '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
end
local tokens = tonumber(ARGV[2])
if tokens > 0 then
  local t = redis.call('TIME')
  local second = tonumber(t[1])
  redis.call('HINCRBY', KEYS[2], second, tokens)
  redis.call('PEXPIRE', KEYS[2], 62000)
  if redis.call('HLEN', KEYS[2]) > 64 then
    local window = redis.call('HGETALL', KEYS[2])
    for i = 1, #window, 2 do
      local s = tonumber(window[i])
      if s == nil or s < second - 60 then redis.call('HDEL', KEYS[2], window[i]) end
    end
  end
end
return 1
)lua";

std::string number(double d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", d);
  return buf;
}

class RedisClientKeys;

net::awaitable<void> send_release(std::shared_ptr<RedisConnection> conn, const RedisScript& script,
                                  std::vector<std::string> keys, std::vector<std::string> args) {
  co_await run_script(*conn, script, keys, args);
}

class RedisLimiter final : public ClientLimiter {
 public:
  RedisLimiter(RedisClientKeys& owner, net::any_io_executor ex);
  ~RedisLimiter() override { conn_->stop(); }

  net::awaitable<Admission> admit(const ClientKey& key, std::string_view request_id,
                                  std::uint64_t reserve) override;
  void release(const ClientKey& key, const std::string& slot, std::uint64_t tokens,
               std::uint64_t reserved) override;

 private:
  RedisClientKeys& owner_;
  net::any_io_executor ex_;
  std::shared_ptr<RedisConnection> conn_;
  std::uint64_t next_slot_ = 0;
};

class RedisClientKeys final : public ClientKeys {
 public:
  RedisClientKeys(KeyTable file_keys, RedisClientKeysOptions options,
                  RedisConnectionSettings settings)
      : ClientKeys(std::move(file_keys), options.fail_open),
        options_(std::move(options)),
        settings_(std::move(settings)),
        admit_(kAdmitScript),
        release_(kReleaseScript) {
    // Slots are named per process, so two replicas never share one.
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx",
                  static_cast<unsigned long long>(std::random_device{}()) << 32 ^
                      static_cast<unsigned long long>(std::random_device{}()));
    nonce_ = buf;
  }
  ~RedisClientKeys() override {
    if (refresh_conn_)
      refresh_conn_->stop();
  }
  RedisClientKeys(const RedisClientKeys&) = delete;
  RedisClientKeys& operator=(const RedisClientKeys&) = delete;

  std::unique_ptr<ClientLimiter> make_limiter(net::any_io_executor worker) override {
    return std::make_unique<RedisLimiter>(*this, std::move(worker));
  }

  void start(net::any_io_executor ex) override {
    if (!options_.keys_from_redis)
      return;
    refresh_conn_ = RedisConnection::create(ex, settings_, connections_);
    refresh_conn_->start();
    net::co_spawn(ex, refresh_loop(ex, refresh_conn_), net::detached);
  }

  const RedisClientKeysOptions& options() const { return options_; }
  const RedisConnectionSettings& settings() const { return settings_; }
  RedisConnectionsShared& connections() { return connections_; }
  const RedisScript& admit_script() const { return admit_; }
  const RedisScript& release_script() const { return release_; }
  const std::string& nonce() const { return nonce_; }

 private:
  // Reads the key hash every refresh interval. An entry that is bad (its
  // field, its JSON, a key past the bounds) is left out, and said at most
  // every 30 s; Redis unreachable keeps the keys last read.
  net::awaitable<void> refresh_loop(net::any_io_executor ex,
                                    std::shared_ptr<RedisConnection> conn) {
    net::steady_timer timer(ex);
    const std::string hash = options_.key_prefix + "api_keys";
    WarnLimiter warn(std::chrono::seconds(30));
    bool first = true;
    while (true) {
      // The owner stopped and let go of the connection: the gateway ends.
      if (conn.use_count() == 1)
        co_return;
      if (conn->ready()) {
        std::vector<std::string_view> argv{std::string_view("HGETALL"), hash};
        RedisReply r = co_await conn->command(argv);
        if (conn.use_count() > 1 && r.type == RedisReply::Type::array) {
          std::vector<std::pair<std::string_view, std::string_view>> pairs;
          pairs.reserve(r.elements.size() / 2);
          for (std::size_t i = 0; i + 1 < r.elements.size(); i += 2)
            pairs.emplace_back(r.elements[i].text, r.elements[i + 1].text);
          KeyHashRead read = keys_from_hash(pairs);
          std::uint64_t held = 0;
          if (read.left_out > 0 && warn.allow(steady_now_ms(), held)) {
            spdlog::warn("api keys: {} entr{} of {} left out: {}", read.left_out,
                         read.left_out == 1 ? "y" : "ies", hash, read.problems.front());
          }
          if (first)
            spdlog::info("api keys: {} read from redis", read.keys.size());
          first = false;
          set_shared_keys(std::move(read.keys));
        }
      }
      if (conn.use_count() == 1)
        co_return;
      timer.expires_after(first && !conn->ready() ? std::chrono::milliseconds(100)
                                                  : options_.refresh_interval);
      co_await timer.async_wait(net::as_tuple(net::use_awaitable));
    }
  }

  static std::int64_t steady_now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  RedisClientKeysOptions options_;
  RedisConnectionSettings settings_;
  RedisConnectionsShared connections_;
  RedisScript admit_;
  RedisScript release_;
  std::string nonce_;
  std::shared_ptr<RedisConnection> refresh_conn_;
};

RedisLimiter::RedisLimiter(RedisClientKeys& owner, net::any_io_executor ex)
    : owner_(owner),
      ex_(ex),
      conn_(RedisConnection::create(std::move(ex), owner.settings(), owner.connections())) {
  conn_->start();
}

net::awaitable<Admission> RedisLimiter::admit(const ClientKey& key, std::string_view request_id,
                                              std::uint64_t reserve) {
  const auto& prefix = owner_.options().key_prefix;
  const KeyLimits& l = key.limits;
  std::string slot;
  if (l.concurrent > 0 || l.tokens_per_minute > 0) {
    slot = owner_.nonce() + ":" + std::to_string(++next_slot_) + ":" +
           std::string(request_id.substr(0, 64));
  }
  const std::vector<std::string> keys = {
      client_limit_key(prefix, key.name, "rate"), client_limit_key(prefix, key.name, "slots"),
      client_limit_key(prefix, key.name, "tokens"), client_limit_key(prefix, key.name, "reserved")};
  const std::vector<std::string> args = {number(l.requests_per_second),
                                         number(l.bucket()),
                                         std::to_string(l.concurrent),
                                         std::to_string(l.tokens_per_minute),
                                         slot,
                                         std::to_string(owner_.options().slot_lease.count()),
                                         std::to_string(reserve)};
  RedisReply r = co_await run_script(*conn_, owner_.admit_script(), keys, args);
  Admission a;
  if (r.type != RedisReply::Type::array || r.elements.size() != 3 ||
      r.elements[0].type != RedisReply::Type::integer) {
    a.verdict = Admission::Verdict::unavailable;
    a.reason = r.text.empty() ? "unexpected reply from redis" : r.text;
    co_return a;
  }
  if (r.elements[0].integer == 1) {
    a.slot = std::move(slot);
    co_return a;
  }
  a.verdict = Admission::Verdict::limited;
  a.retry_after = std::chrono::milliseconds(r.elements[1].integer);
  a.reason = r.elements[2].text;
  co_return a;
}

void RedisLimiter::release(const ClientKey& key, const std::string& slot, std::uint64_t tokens,
                           std::uint64_t /*reserved: the slot names it in Redis*/) {
  if (slot.empty() && tokens == 0)
    return;
  const auto& prefix = owner_.options().key_prefix;
  std::vector<std::string> keys = {client_limit_key(prefix, key.name, "slots"),
                                   client_limit_key(prefix, key.name, "tokens"),
                                   client_limit_key(prefix, key.name, "reserved")};
  std::vector<std::string> args = {slot, std::to_string(tokens)};
  // Not waited for: the client's answer is already written. A release
  // that is lost (Redis down) frees its slot when the lease ends.
  net::co_spawn(ex_, send_release(conn_, owner_.release_script(), std::move(keys), std::move(args)),
                net::detached);
}

}  // namespace

std::string client_limit_key(std::string_view prefix, std::string_view name,
                             std::string_view which) {
  std::string k;
  k.reserve(prefix.size() + name.size() + which.size() + 8);
  k.append(prefix).append("limit:").append(name).append(":").append(which);
  return k;
}

Result<std::unique_ptr<ClientKeys>> make_redis_client_keys(KeyTable file_keys,
                                                           RedisClientKeysOptions options) {
  auto settings = script_connection_settings(options.redis_url, options.redis, options.timeout);
  if (!settings)
    return fail(settings.error());
  return std::unique_ptr<ClientKeys>(
      std::make_unique<RedisClientKeys>(std::move(file_keys), std::move(options), *settings));
}

}  // namespace pdgate
