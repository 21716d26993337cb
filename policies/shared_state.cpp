#include "policies/shared_state.hpp"

#include <algorithm>

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
  bytes_ -= cost(it->first, it->second.value);
  map_.erase(it);
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
  const std::size_t old = it == map_.end() ? 0 : cost(it->first, it->second.value);
  if (bytes_ - old + add > max_bytes_)
    return fail("shared store full");
  bytes_ = bytes_ - old + add;
  Entry e{std::move(value), ttl_ms > 0 ? now_ms + ttl_ms : 0};
  if (it == map_.end()) {
    map_.emplace(std::move(k), std::move(e));
  } else {
    it->second = std::move(e);
  }
  return true;
}

Result<double> KvStore::incr(std::string_view key, double delta, std::int64_t now_ms) {
  std::lock_guard lock(mu_);
  std::string k(key);
  auto it = map_.find(k);
  if (it != map_.end() && it->second.expires_ms != 0 && it->second.expires_ms <= now_ms) {
    erase_locked(it);
    it = map_.end();
  }
  if (it == map_.end()) {
    const std::size_t add = cost(k, KvValue{0.0});
    if (bytes_ + add > max_bytes_)
      return fail("shared store full");
    bytes_ += add;
    map_.emplace(std::move(k), Entry{delta, 0});
    return delta;
  }
  auto* d = std::get_if<double>(&it->second.value);
  if (d == nullptr)
    return fail("value is not a number");
  *d += delta;
  return *d;
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

}  // namespace pdgate::policy
