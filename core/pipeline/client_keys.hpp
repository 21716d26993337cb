// Client API keys and their limits (--api-keys FILE, --api-keys-from-redis).
// With keys configured, every /v1/ request must carry
// `Authorization: Bearer <key>` for a known key; each key may carry limits
// (requests per second, concurrent requests, prompt+completion tokens per
// minute) that hold across every replica sharing the same Redis.
//
// Keys are stored hashed (SHA-256, hex): the gateway never needs, nor
// keeps, a key in clear. A lookup is local (a hash table refreshed in the
// background), so a key without limits costs no round trip; a key with
// limits costs one limiter call per request (one Redis script call when
// shared), and its release at the end of the request is sent without
// waiting.
//
// Interfaces here; the shared (Redis) limiter and key source live in
// plugins/, chosen by the composition root.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "core/base/result.hpp"
#include "core/pipeline/client_key.hpp"

namespace pdgate {

namespace net = boost::asio;

using ClientKeyPtr = std::shared_ptr<const ClientKey>;

// The table of keys by the hex SHA-256 of the key.
using KeyTable = std::unordered_map<std::string, ClientKeyPtr>;

// Bounds on one key, whatever gave it (the key file, Redis): the name goes
// into every limiter call's Redis keys and the policies' request view,
// the labels (held to LabelLimits, core/config/config.hpp, like an
// instance's) are copied into the policy VM for every request.
inline constexpr std::size_t kMaxKeyNameBytes = 128;
// One key's JSON read from Redis: room for the largest labels allowed.
inline constexpr std::size_t kMaxKeyJsonBytes = 64 * 1024;

// Whether `hex` is how keys are stored: 64 lower-case hex digits (the
// SHA-256 of the key).
bool is_key_hash(std::string_view hex);

// Parses a key file (YAML):
//   keys:
//     - name: team-a
//       sha256: 9f86d0...   # hex SHA-256 of the key (`printf %s KEY | sha256sum`)
//       labels: {tier: gold}
//       requests_per_second: 5
//       burst: 10
//       concurrent: 4
//       tokens_per_minute: 100000
// Every error names the entry; the whole file is refused on any error,
// a key past the bounds above included.
Result<KeyTable> parse_key_file(std::string_view yaml_text);
// The --api-keys file at `path`, read and parsed (at start and on SIGHUP,
// on the control thread): errors name the file.
Result<KeyTable> read_key_file(const std::string& path);
// One key's fields from JSON (how keys are stored in Redis: a hash from the
// hex SHA-256 to this JSON, plugins/redis_key_hash.hpp), at most
// kMaxKeyJsonBytes long.
Result<ClientKeyPtr> parse_key_json(std::string_view json_text);

// The key of `Authorization: Bearer <key>`; empty when the header is
// missing or not a bearer token.
std::string_view bearer_token(std::string_view authorization);

// GCRA (the generic cell rate algorithm, a token bucket kept as one
// number): `tat` is the theoretical arrival time of the next request in
// ms. Admits when the bucket has room and advances tat; else says when to
// come back. The Redis script (plugins/redis_client_limits.cpp) does the
// same arithmetic on Redis's clock.
struct RateStep {
  bool allowed = false;
  double tat_ms = 0;  // the new tat (unchanged when refused)
  std::int64_t retry_after_ms = 0;
};
RateStep gcra_step(double tat_ms, double now_ms, double per_second, double bucket);

// The tokens a key used in the last minute, a sliding window kept in
// one-second buckets. A calendar minute (what this replaced) let twice the
// limit through across a minute's boundary and told a refused client to
// wait for the minute's end, not for its tokens to free. A bucket counts
// from the start of its second until kSpanSeconds later, so every 60 s span
// is covered (the limit holds in any minute, not only calendar ones) and a
// token is held at most 1 s longer than a minute. At most kSpanSeconds
// buckets: memory is bounded whatever the request rate, where a log of
// every request's (time, tokens) would grow with it. The Redis script
// (plugins/redis_client_keys.cpp) keeps the same buckets in a hash.
class TokenWindow {
 public:
  static constexpr std::int64_t kSpanSeconds = 61;
  // The tokens used in the window at `now_ms`; drops the buckets it left.
  std::uint64_t used(double now_ms);
  // Counts `tokens` used at `now_ms` (never earlier than the last add).
  void add(double now_ms, std::uint64_t tokens);
  // How long from `now_ms` until the tokens in the window are fewer than
  // `limit`, as buckets leave it (0 when they already are).
  std::int64_t wait_below_ms(double now_ms, std::uint64_t limit) const;
  std::size_t buckets() const { return buckets_.size(); }

 private:
  void expire(std::int64_t second);
  std::deque<std::pair<std::int64_t, std::uint64_t>> buckets_;  // (second, tokens), oldest first
  std::uint64_t sum_ = 0;
};

// Whether a request reserving `reserve` tokens fits a tokens-per-minute
// limit with `used` tokens spent in the last minute and `reserved` held by
// requests in flight: the one rule the local limiter and the Redis script
// apply. Room must be left; and a request is let in alone whatever it
// reserves (none held, less than the limit used).
bool tokens_fit(std::uint64_t limit, std::uint64_t used, std::uint64_t reserved,
                std::uint64_t reserve);

struct Admission {
  enum class Verdict { admitted, limited, unavailable };
  Verdict verdict = Verdict::admitted;
  std::chrono::milliseconds retry_after{0};
  std::string reason;  // "rate", "concurrency", "tokens"; or why unavailable
  // Admitted: the request's concurrency slot, handed back to release().
  std::string slot;
};

// One worker's limiter handle; called on that worker's executor only.
class ClientLimiter {
 public:
  virtual ~ClientLimiter() = default;
  // Counts the request against the key's limits, or says which one it is
  // over. `request_id` goes into the concurrency slot's name (for an
  // operator reading Redis); the slot itself is unique. `reserve` tokens
  // (the request's prompt estimate and its max_tokens) are held against
  // tokens_per_minute until release: a request is refused when the
  // tokens used this minute and those reserved by requests in flight
  // leave no room for it (one request alone is let in whatever it asks,
  // so that a large max_tokens is not refused for ever).
  virtual net::awaitable<Admission> admit(const ClientKey& key, std::string_view request_id,
                                          std::uint64_t reserve) = 0;
  // The admitted request (its slot) ended, having used `tokens` (0 when
  // unknown) of the `reserved` it held. Returns at once: the shared
  // limiter sends it without waiting.
  virtual void release(const ClientKey& key, const std::string& slot, std::uint64_t tokens,
                       std::uint64_t reserved) = 0;
};

struct ClientKeyCounters {
  std::atomic<std::uint64_t> admitted{0};
  std::atomic<std::uint64_t> unauthenticated{0};  // missing or unknown key: 401
  std::atomic<std::uint64_t> limited_rate{0};
  std::atomic<std::uint64_t> limited_concurrency{0};
  std::atomic<std::uint64_t> limited_tokens{0};
  // The shared limiter could not answer: admitted anyway (fail open) or
  // refused with 503 (fail closed).
  std::atomic<std::uint64_t> limiter_unavailable{0};
};

// One key's counts for /metrics, under its name (ClientKey::name).
struct KeyStats {
  std::atomic<std::uint64_t> admitted{0};
  std::atomic<std::uint64_t> limited_rate{0};
  std::atomic<std::uint64_t> limited_concurrency{0};
  std::atomic<std::uint64_t> limited_tokens{0};
  std::atomic<std::uint64_t> limiter_unavailable{0};
  // Prompt and completion tokens of its requests, as the engines counted
  // them (what tokens_per_minute is counted in).
  std::atomic<std::uint64_t> tokens{0};
};

// The process-wide part: the key table, the per-worker limiters, counters.
class ClientKeys {
 public:
  virtual ~ClientKeys() = default;
  // The key presented, looked up by its hash; nullptr when unknown.
  ClientKeyPtr find(std::string_view presented) const;
  virtual std::unique_ptr<ClientLimiter> make_limiter(net::any_io_executor worker) = 0;
  // Starts background work (refreshing keys from Redis) on `ex`.
  virtual void start(net::any_io_executor /*ex*/) {}
  // When the shared limiter cannot answer: admit (true) or refuse (503).
  bool fail_open() const { return fail_open_; }
  ClientKeyCounters& counters() { return counters_; }
  const ClientKeyCounters& counters() const { return counters_; }
  std::size_t size() const;

  // What replacing the file's keys changed: keys only the new table has,
  // keys only the old one had, keys in both whose name, labels or limits
  // differ.
  struct FileKeyChanges {
    std::size_t added = 0;
    std::size_t removed = 0;
    std::size_t changed = 0;
  };
  // Replaces the keys read from --api-keys (SIGHUP re-read the file).
  // Requests already admitted keep the key they were admitted with.
  FileKeyChanges replace_file_keys(KeyTable keys);

  // Per-key series are bounded: the first kMaxKeySeries names get their
  // own, later ones share the series named kOtherKeys (a key table from
  // Redis may hold any number of keys; /metrics must not grow with it).
  static constexpr std::size_t kMaxKeySeries = 256;
  static constexpr std::string_view kOtherKeys = "other";
  // `key`'s counts (stable for the process's life).
  KeyStats& stats_for(const ClientKey& key);
  // Every series so far, by name (kOtherKeys last when used).
  void for_each_key_stats(
      const std::function<void(const std::string& name, const KeyStats&)>& fn) const;

 protected:
  ClientKeys(KeyTable file_keys, bool fail_open);
  // Replaces the keys learnt from a shared source (file keys stay; a file
  // key wins over a shared key with the same hash).
  void set_shared_keys(KeyTable shared);

 private:
  mutable std::mutex mu_;  // a lookup is a hash and two pointer copies
  std::shared_ptr<const KeyTable> file_keys_;
  std::shared_ptr<const KeyTable> shared_keys_;
  const bool fail_open_;
  ClientKeyCounters counters_;
  mutable std::shared_mutex stats_mu_;
  std::unordered_map<std::string, std::unique_ptr<KeyStats>> stats_;
  KeyStats other_stats_;
  std::atomic<bool> other_used_{false};
};

// Keys from a file, limits kept in this process (no Redis): each replica
// enforces them on its own share of the traffic.
std::unique_ptr<ClientKeys> make_local_client_keys(KeyTable keys);

// The in-process limiter state, shared by a process's workers; `now_ms`
// is injected so the arithmetic is unit-tested without a clock.
class LocalLimits {
 public:
  Admission admit(const ClientKey& key, std::string_view request_id, double now_ms,
                  std::uint64_t reserve = 0);
  void release(const ClientKey& key, std::uint64_t tokens, double now_ms,
               std::uint64_t reserved = 0);

 private:
  struct State {
    double tat_ms = 0;
    std::uint32_t in_flight = 0;
    TokenWindow tokens;          // used in the last minute
    std::uint64_t reserved = 0;  // held by requests in flight
  };
  std::mutex mu_;
  std::unordered_map<std::string, State> by_key_;  // bounded by the key table
};

}  // namespace pdgate
