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

// --- ConversationTable ------------------------------------------------------

std::optional<ConversationEntry> ConversationTable::get(std::string_view id) {
  std::lock_guard lock(mu_);
  const std::string k(id);
  if (auto it = cur_.find(k); it != cur_.end())
    return it->second;
  if (auto it = prev_.find(k); it != prev_.end())
    return it->second;
  return std::nullopt;
}

void ConversationTable::put(std::string_view id, const ConversationEntry& e) {
  std::lock_guard lock(mu_);
  if (cur_.size() >= half_) {
    prev_ = std::move(cur_);
    cur_.clear();
  }
  cur_[std::string(id)] = e;
}

// --- PrefixIndex ------------------------------------------------------------

PrefixIndex::PrefixIndex(std::size_t capacity, std::int64_t ttl_ms)
    : half_per_shard_(std::max<std::size_t>(capacity / kShards / 2, 1)), ttl_ms_(ttl_ms) {}

void PrefixIndex::record(const std::vector<std::uint64_t>& hashes, std::uint64_t instance_id,
                         std::int64_t now_ms) {
  for (const std::uint64_t h : hashes) {
    Shard& s = shards_[h % kShards];
    std::lock_guard lock(s.mu);
    auto it = s.cur.find(h);
    if (it == s.cur.end()) {
      if (s.cur.size() >= half_per_shard_) {
        s.prev = std::move(s.cur);
        s.cur.clear();
      }
      Routes r{};
      // Carry the routes over from the previous generation, so a block
      // that stays in use keeps all its instances.
      if (auto p = s.prev.find(h); p != s.prev.end())
        r = p->second;
      it = s.cur.emplace(h, r).first;
    }
    Routes& routes = it->second;
    // Refresh this instance's slot, or take the oldest one.
    std::size_t slot = 0;
    for (std::size_t i = 0; i < kWays; ++i) {
      if (routes[i].instance == instance_id) {
        slot = i;
        break;
      }
      if (routes[i].at_ms < routes[slot].at_ms)
        slot = i;
    }
    routes[slot] = Route{instance_id, now_ms};
  }
}

std::vector<std::pair<std::uint64_t, std::size_t>> PrefixIndex::matches(
    const std::vector<std::uint64_t>& hashes, std::int64_t now_ms, std::size_t enough) const {
  std::vector<std::pair<std::uint64_t, std::size_t>> out;
  // Walk from the last block back: the first block at which an instance
  // appears is the end of its longest cached prefix (hashes are chained).
  for (std::size_t i = hashes.size(); i-- > 0;) {
    const std::uint64_t h = hashes[i];
    const Shard& s = shards_[h % kShards];
    Routes routes{};
    {
      std::lock_guard lock(s.mu);
      auto it = s.cur.find(h);
      if (it != s.cur.end()) {
        routes = it->second;
      } else if (auto p = s.prev.find(h); p != s.prev.end()) {
        routes = p->second;
      } else {
        continue;
      }
    }
    for (const Route& r : routes) {
      if (r.instance == 0 || now_ms - r.at_ms > ttl_ms_)
        continue;
      const bool seen =
          std::any_of(out.begin(), out.end(), [&](const auto& m) { return m.first == r.instance; });
      if (!seen)
        out.emplace_back(r.instance, i + 1);
    }
    if (out.size() >= enough)
      break;
  }
  return out;
}

}  // namespace pdgate::policy
