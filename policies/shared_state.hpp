// The key/value store that policies share across worker threads
// (pdgate.kv_get/kv_set): bounded in memory and protected by a mutex; the
// critical sections are a few map operations, far below a pick's budget.
// Where prefixes and conversations were routed is kept apart, in a
// KvLocationIndex (core/routing/kv_location_index.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/base/result.hpp"
#include "core/routing/request_hook.hpp"

namespace pdgate::policy {

// A value a policy may store: number, string or boolean (no tables, so
// nothing in one worker's Lua state is ever referenced from another).
using KvValue = std::variant<double, std::string, bool>;

class KvStore {
 public:
  explicit KvStore(std::size_t max_bytes = 1u << 20) : max_bytes_(max_bytes) {}
  std::optional<KvValue> get(std::string_view key, std::int64_t now_ms);
  // ttl_ms 0: no expiry. Fails when the store would exceed its byte cap.
  Result<bool> set(std::string_view key, KvValue value, std::int64_t ttl_ms, std::int64_t now_ms);
  // Adds to a number (absent counts as 0) and returns the new value. A
  // key this creates expires after ttl_ms (0: never): the counter of a
  // fixed window, set and expired in one step.
  Result<double> incr(std::string_view key, double delta, std::int64_t now_ms,
                      std::int64_t ttl_ms = 0);
  void erase(std::string_view key);
  std::size_t bytes() const;

  // A sliding-window limit: whether one more event under `key` fits in
  // `limit` per `window_ms` (and is then counted), exact across the
  // workers that share the store. The log keeps one time per event
  // counted, at most kMaxRateLimit per key.
  struct RateAnswer {
    bool allowed = false;
    std::int64_t count = 0;           // events in the window, this one included if allowed
    std::int64_t retry_after_ms = 0;  // when refused: until the oldest event leaves the window
  };
  static constexpr std::int64_t kMaxRateLimit = 100000;
  Result<RateAnswer> rate(std::string_view key, std::int64_t limit, std::int64_t window_ms,
                          std::int64_t now_ms);
  // What rate() would answer now, counting nothing (explain's dry picks).
  Result<RateAnswer> rate_peek(std::string_view key, std::int64_t limit, std::int64_t window_ms,
                               std::int64_t now_ms) const;
  // Several limits judged together under one lock (a request's declared
  // limits, core/pipeline/rate_limit_phase.hpp): with `count`, one event
  // is counted under every key only when every limit lets it in. Without
  // (explain's dry check), or when one refuses, nothing is counted and
  // each answer's count is its window's as it stands.
  struct RateQuery {
    std::string_view key;
    std::int64_t limit = 0;
    std::int64_t window_ms = 0;
  };
  Result<std::vector<RateAnswer>> rate_all(std::span<const RateQuery> queries, std::int64_t now_ms,
                                           bool count);
  // What incr() would return now, changing nothing.
  Result<double> incr_peek(std::string_view key, double delta, std::int64_t now_ms) const;

  // Up to `max` live entries whose key starts with `prefix`, in key order
  // (the admin API's listing), and how many matched in all.
  struct Listed {
    std::string key;
    KvValue value;
    std::int64_t ttl_ms = 0;  // left; 0: none
  };
  std::vector<Listed> list(std::string_view prefix, std::size_t max, std::int64_t now_ms,
                           std::size_t& matched) const;

 private:
  struct Entry {
    KvValue value;
    std::int64_t expires_ms = 0;  // 0: never
    // pdgate.rate: the times of the events in the window, oldest first
    // (the value then is their count).
    std::vector<std::int64_t> times;
    std::size_t head = 0;  // times[head..] are in the window
  };
  static std::size_t cost(std::string_view key, const KvValue& v);
  static bool expired(const Entry& e, std::int64_t now_ms) {
    return e.expires_ms != 0 && e.expires_ms <= now_ms;
  }
  // A rate log's first event still in the window, and the answer to one
  // more event; the log is not changed.
  static std::size_t window_start(const Entry& e, std::int64_t window_ms, std::int64_t now_ms);
  static RateAnswer assess(const Entry& e, std::size_t first, std::int64_t limit,
                           std::int64_t window_ms, std::int64_t now_ms);
  Result<RateAnswer> rate_locked(std::string_view key, std::int64_t limit, std::int64_t window_ms,
                                 std::int64_t now_ms);
  Result<RateAnswer> rate_peek_locked(std::string_view key, std::int64_t limit,
                                      std::int64_t window_ms, std::int64_t now_ms) const;
  void erase_locked(std::unordered_map<std::string, Entry>::iterator it);
  // Room for `add` more bytes, expired entries dropped first if needed.
  bool make_room_locked(std::size_t add, std::int64_t now_ms);

  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> map_;
  std::size_t bytes_ = 0;
  const std::size_t max_bytes_;
};

// The request hook's declared limits (req:rate_limit) judged by `kv` at
// this moment, and with `count` counted (KvStore::rate_all): what a
// replica answers without Redis, or when Redis does not
// (core/pipeline/rate_limit_phase.hpp).
Result<std::vector<RateLimitAnswer>> check_rate_limits(KvStore& kv,
                                                       std::span<const RateLimitDecl> limits,
                                                       bool count);

}  // namespace pdgate::policy
