#include "policies/local_kv_index.hpp"

namespace pdgate::policy {

// --- ConversationTable ------------------------------------------------------

std::optional<ConversationRoute> ConversationTable::get(std::string_view id) const {
  std::lock_guard lock(mu_);
  const std::string k(id);
  if (auto it = cur_.find(k); it != cur_.end())
    return it->second;
  if (auto it = prev_.find(k); it != prev_.end())
    return it->second;
  return std::nullopt;
}

void ConversationTable::put(std::string_view id, const ConversationRoute& e) {
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

void PrefixIndex::record(const std::vector<std::uint64_t>& hashes, InstanceKey instance_id,
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
    // A record may arrive late (another replica's, or one caught up after
    // an outage): it never makes a route look older, nor pushes out a
    // newer route of another instance.
    Route& r = routes[slot];
    if (r.instance == instance_id) {
      r.at_ms = std::max(r.at_ms, now_ms);
    } else if (r.instance == 0 || r.at_ms <= now_ms) {
      r = Route{instance_id, now_ms};
    }
  }
}

std::vector<std::pair<InstanceKey, std::size_t>> PrefixIndex::matches(
    const std::vector<std::uint64_t>& hashes, std::int64_t now_ms, std::size_t enough) const {
  std::vector<std::pair<InstanceKey, std::size_t>> out;
  // Walk from the last block back: the first block at which an instance
  // appears is the end of its longest cached prefix (hashes are chained).
  for (std::size_t i = hashes.size(); i-- > 0;) {
    const std::uint64_t h = hashes[i];
    const Shard& s = shards_[h % kShards];
    std::lock_guard lock(s.mu);
    const Routes* found = nullptr;
    if (auto it = s.cur.find(h); it != s.cur.end()) {
      found = &it->second;
    } else if (auto p = s.prev.find(h); p != s.prev.end()) {
      found = &p->second;
    } else {
      continue;
    }
    for (const Route& r : *found) {
      if (r.instance == 0 || now_ms - r.at_ms > ttl_ms_ || hidden(s, r, now_ms))
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

bool PrefixIndex::hidden(const Shard& s, const Route& r, std::int64_t now_ms) const {
  for (const Forgotten& f : s.forgotten) {
    if (f.instance == r.instance && r.at_ms <= f.at_ms && now_ms - f.at_ms <= ttl_ms_)
      return true;
  }
  return false;
}

void PrefixIndex::forget(InstanceKey instance, std::int64_t now_ms) {
  for (Shard& s : shards_) {
    std::lock_guard lock(s.mu);
    // Entries past the TTL hide nothing any more.
    std::erase_if(s.forgotten, [&](const Forgotten& f) {
      return f.instance == instance || now_ms - f.at_ms > ttl_ms_;
    });
    if (s.forgotten.size() >= kMaxForgotten)
      s.forgotten.erase(s.forgotten.begin());
    s.forgotten.push_back(Forgotten{instance, now_ms});
  }
}

}  // namespace pdgate::policy
