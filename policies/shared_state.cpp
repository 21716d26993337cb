#include "policies/shared_state.hpp"

#include <algorithm>
#include <chrono>

namespace pdgate::policy {

// --- KvStore ----------------------------------------------------------------

std::size_t KvStore::cost(std::string_view key, const KvValue& v) {
  // A fixed overhead per entry stands for the map node, so a flood of
  // tiny keys is capped too.
  constexpr std::size_t kEntryOverhead = 64;
  const std::size_t value_bytes =
      std::holds_alternative<std::string>(v) ? std::get<std::string>(v).size() : 8;
  return key.size() + value_bytes + kEntryOverhead;
}

void KvStore::erase_locked(std::unordered_map<std::string, Entry>::iterator it) {
  bytes_ -= cost(it->first, it->second.value) + it->second.times.capacity() * 8;
  map_.erase(it);
}

bool KvStore::make_room_locked(std::size_t add, std::int64_t now_ms) {
  if (bytes_ + add <= max_bytes_)
    return true;
  // Keys with a TTL are only dropped when read: a full store sweeps them
  // (at most its byte cap / 64 entries, rarely) before refusing.
  for (auto it = map_.begin(); it != map_.end();) {
    auto next = std::next(it);
    if (it->second.expires_ms != 0 && it->second.expires_ms <= now_ms)
      erase_locked(it);
    it = next;
  }
  return bytes_ + add <= max_bytes_;
}

std::optional<KvValue> KvStore::get(std::string_view key, std::int64_t now_ms) {
  std::lock_guard lock(mu_);
  auto it = map_.find(std::string(key));
  if (it == map_.end())
    return std::nullopt;
  if (it->second.expires_ms != 0 && it->second.expires_ms <= now_ms) {
    erase_locked(it);
    return std::nullopt;
  }
  return it->second.value;
}

Result<bool> KvStore::set(std::string_view key, KvValue value, std::int64_t ttl_ms,
                          std::int64_t now_ms) {
  std::lock_guard lock(mu_);
  const std::size_t add = cost(key, value);
  std::string k(key);
  auto it = map_.find(k);
  if (it != map_.end())
    erase_locked(it);
  if (!make_room_locked(add, now_ms))
    return fail("shared store full");
  bytes_ += add;
  map_.emplace(std::move(k), Entry{std::move(value), ttl_ms > 0 ? now_ms + ttl_ms : 0, {}, 0});
  return true;
}

Result<double> KvStore::incr(std::string_view key, double delta, std::int64_t now_ms,
                             std::int64_t ttl_ms) {
  std::lock_guard lock(mu_);
  std::string k(key);
  auto it = map_.find(k);
  if (it != map_.end() && it->second.expires_ms != 0 && it->second.expires_ms <= now_ms) {
    erase_locked(it);
    it = map_.end();
  }
  if (it == map_.end()) {
    const std::size_t add = cost(k, KvValue{0.0});
    if (!make_room_locked(add, now_ms))
      return fail("shared store full");
    bytes_ += add;
    map_.emplace(std::move(k), Entry{delta, ttl_ms > 0 ? now_ms + ttl_ms : 0, {}, 0});
    return delta;
  }
  auto* d = std::get_if<double>(&it->second.value);
  if (d == nullptr || !it->second.times.empty())
    return fail("value is not a number");
  *d += delta;
  return *d;
}

namespace {

std::optional<std::string> rate_args_error(std::int64_t limit, std::int64_t window_ms) {
  if (limit < 1 || limit > KvStore::kMaxRateLimit)
    return "limit must be 1.." + std::to_string(KvStore::kMaxRateLimit);
  if (window_ms < 1)
    return std::string("window must be positive");
  return std::nullopt;
}

}  // namespace

std::size_t KvStore::window_start(const Entry& e, std::int64_t window_ms, std::int64_t now_ms) {
  std::size_t first = e.head;
  while (first < e.times.size() && e.times[first] <= now_ms - window_ms)
    ++first;
  return first;
}

KvStore::RateAnswer KvStore::assess(const Entry& e, std::size_t first, std::int64_t limit,
                                    std::int64_t window_ms, std::int64_t now_ms) {
  RateAnswer a;
  a.count = static_cast<std::int64_t>(e.times.size() - first);
  // Over the limit (a smaller limit than before counts only the newest).
  if (a.count >= limit) {
    const std::int64_t oldest = e.times[e.times.size() - static_cast<std::size_t>(limit)];
    a.retry_after_ms = std::max<std::int64_t>(1, oldest + window_ms - now_ms);
  } else {
    a.allowed = true;
    ++a.count;
  }
  return a;
}

Result<KvStore::RateAnswer> KvStore::rate_peek(std::string_view key, std::int64_t limit,
                                               std::int64_t window_ms, std::int64_t now_ms) const {
  if (auto err = rate_args_error(limit, window_ms))
    return fail(*err);
  std::lock_guard lock(mu_);
  return rate_peek_locked(key, limit, window_ms, now_ms);
}

Result<KvStore::RateAnswer> KvStore::rate_peek_locked(std::string_view key, std::int64_t limit,
                                                      std::int64_t window_ms,
                                                      std::int64_t now_ms) const {
  auto it = map_.find(std::string(key));
  if (it == map_.end() || expired(it->second, now_ms))
    return assess(Entry{}, 0, limit, window_ms, now_ms);
  if (it->second.times.empty())
    return fail("key holds a value that is not a rate log");
  const Entry& e = it->second;
  return assess(e, window_start(e, window_ms, now_ms), limit, window_ms, now_ms);
}

Result<double> KvStore::incr_peek(std::string_view key, double delta, std::int64_t now_ms) const {
  std::lock_guard lock(mu_);
  auto it = map_.find(std::string(key));
  if (it == map_.end() || expired(it->second, now_ms))
    return delta;
  const auto* d = std::get_if<double>(&it->second.value);
  if (d == nullptr || !it->second.times.empty())
    return fail("value is not a number");
  return *d + delta;
}

Result<KvStore::RateAnswer> KvStore::rate(std::string_view key, std::int64_t limit,
                                          std::int64_t window_ms, std::int64_t now_ms) {
  if (auto err = rate_args_error(limit, window_ms))
    return fail(*err);
  std::lock_guard lock(mu_);
  return rate_locked(key, limit, window_ms, now_ms);
}

Result<std::vector<KvStore::RateAnswer>> KvStore::rate_all(std::span<const RateQuery> queries,
                                                           std::int64_t now_ms, bool count) {
  for (const RateQuery& q : queries) {
    if (auto err = rate_args_error(q.limit, q.window_ms))
      return fail(*err);
  }
  std::vector<RateAnswer> out;
  out.reserve(queries.size());
  std::lock_guard lock(mu_);
  // All of them judged before any is counted: a request one limit refuses
  // takes no room under the others.
  bool all = true;
  for (const RateQuery& q : queries) {
    auto a = rate_peek_locked(q.key, q.limit, q.window_ms, now_ms);
    if (!a)
      return fail(a.error());
    all = all && a->allowed;
    out.push_back(*a);
  }
  if (!count || !all) {
    // Nothing counted: the counts are the window's as it is.
    for (RateAnswer& a : out)
      a.count -= a.allowed ? 1 : 0;
    return out;
  }
  for (std::size_t i = 0; i < queries.size(); ++i) {
    auto a = rate_locked(queries[i].key, queries[i].limit, queries[i].window_ms, now_ms);
    if (!a)
      return fail(a.error());
    out[i] = *a;
  }
  return out;
}

Result<KvStore::RateAnswer> KvStore::rate_locked(std::string_view key, std::int64_t limit,
                                                 std::int64_t window_ms, std::int64_t now_ms) {
  std::string k(key);
  auto it = map_.find(k);
  if (it != map_.end() && it->second.times.empty() &&
      (it->second.expires_ms == 0 || it->second.expires_ms > now_ms))
    return fail("key holds a value that is not a rate log");
  if (it == map_.end() || (it->second.expires_ms != 0 && it->second.expires_ms <= now_ms)) {
    if (it != map_.end())
      erase_locked(it);
    const std::size_t add = cost(k, KvValue{0.0});
    if (!make_room_locked(add, now_ms))
      return fail("shared store full");
    bytes_ += add;
    it = map_.emplace(std::move(k), Entry{0.0, 0, {}, 0}).first;
  }
  Entry& e = it->second;
  e.expires_ms = 0;  // so that making room below cannot sweep this entry
  // Events that left the window; the log is compacted when half of it is.
  e.head = window_start(e, window_ms, now_ms);
  if (e.head > 0 && e.head * 2 >= e.times.size()) {
    e.times.erase(e.times.begin(), e.times.begin() + static_cast<std::ptrdiff_t>(e.head));
    e.head = 0;
  }
  const RateAnswer a = assess(e, e.head, limit, window_ms, now_ms);
  if (a.allowed) {
    const std::size_t before = e.times.capacity();
    if (e.times.size() == before && !make_room_locked(std::max<std::size_t>(before, 4) * 8, now_ms))
      return fail("shared store full");
    e.times.push_back(now_ms);
    bytes_ += (e.times.capacity() - before) * 8;
  }
  e.value = static_cast<double>(a.count);
  // The log empties itself one window after its last event.
  e.expires_ms = e.times.back() + window_ms;
  return a;
}

namespace {
bool by_key(const KvStore::Listed& a, const KvStore::Listed& b) {
  return a.key < b.key;
}
}  // namespace

std::vector<KvStore::Listed> KvStore::list(std::string_view prefix, std::size_t max,
                                           std::int64_t now_ms, std::size_t& matched) const {
  std::lock_guard lock(mu_);
  std::vector<Listed> out;
  matched = 0;
  for (const auto& [k, e] : map_) {
    if (k.compare(0, prefix.size(), prefix) != 0 || (e.expires_ms != 0 && e.expires_ms <= now_ms))
      continue;
    ++matched;
    out.push_back({k, e.value, e.expires_ms == 0 ? 0 : e.expires_ms - now_ms});
    // Keep the first `max` in key order without holding every match
    // (linear: trimmed each time it doubles).
    if (out.size() >= 2 * max + 2) {
      std::nth_element(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(max), out.end(),
                       by_key);
      out.resize(max);
    }
  }
  std::sort(out.begin(), out.end(), by_key);
  if (out.size() > max)
    out.resize(max);
  return out;
}

void KvStore::erase(std::string_view key) {
  std::lock_guard lock(mu_);
  auto it = map_.find(std::string(key));
  if (it != map_.end())
    erase_locked(it);
}

std::size_t KvStore::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

Result<std::vector<RateLimitAnswer>> check_rate_limits(KvStore& kv,
                                                       std::span<const RateLimitDecl> limits,
                                                       bool count) {
  std::vector<KvStore::RateQuery> queries;
  queries.reserve(limits.size());
  for (const RateLimitDecl& l : limits)
    queries.push_back({l.key, l.limit, l.window_ms});
  const std::int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now().time_since_epoch())
                                  .count();
  auto answers = kv.rate_all(queries, now_ms, count);
  if (!answers)
    return fail(answers.error());
  std::vector<RateLimitAnswer> out;
  out.reserve(answers->size());
  for (const KvStore::RateAnswer& a : *answers)
    out.push_back({a.allowed, a.count, a.retry_after_ms});
  return out;
}

}  // namespace pdgate::policy
