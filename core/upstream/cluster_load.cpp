#include "core/upstream/cluster_load.hpp"

#include <algorithm>

namespace pdgate {

InstanceKey load_key(const Instance& inst) {
  return instance_key(inst.location);
}

LoadReport ClusterLoad::local_report(std::uint64_t origin, std::uint64_t seq,
                                     std::int64_t wall_ms) const {
  LoadReport r{origin, seq, wall_ms, {}};
  for (const auto& [key, list] : by_key_) {
    LoadEntry e{key, 0, 0};
    for (const Instance* inst : list) {
      e.in_flight += std::max<std::int64_t>(inst->in_flight.load(std::memory_order_relaxed), 0);
      e.queued_tokens +=
          std::max<std::int64_t>(inst->queued_tokens.load(std::memory_order_relaxed), 0);
    }
    if (e.in_flight > 0 || e.queued_tokens > 0)
      r.entries.push_back(e);
  }
  return r;
}

void ClusterLoad::use_instances(std::shared_ptr<const InstanceSet> set) {
  if (set == set_)
    return;
  set_ = std::move(set);
  by_key_.clear();
  changed_.clear();
  if (!set_)
    return;
  for (const auto& inst : set_->by_id)
    by_key_[load_key(*inst)].push_back(inst.get());
  for (const auto& [key, list] : by_key_)
    write(key);
}

void ClusterLoad::write(InstanceKey key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end())
    return;
  const LoadEntry t = total(key);
  for (const Instance* inst : it->second) {
    inst->others_in_flight.store(t.in_flight, std::memory_order_relaxed);
    inst->others_queued_tokens.store(t.queued_tokens, std::memory_order_relaxed);
  }
}

ClusterLoad::Applied ClusterLoad::apply(const LoadReport& r, std::uint64_t own_origin,
                                        std::int64_t steady_now_ms) {
  if (r.origin == own_origin)
    return Applied::own;
  if (r.entries.size() > limits_.max_entries)
    return Applied::too_many_entries;
  auto it = replicas_.find(r.origin);
  if (it == replicas_.end()) {
    if (replicas_.size() >= limits_.max_replicas)
      return Applied::too_many_replicas;
    it = replicas_.emplace(r.origin, Replica{}).first;
  } else if (r.seq <= it->second.seq) {
    return Applied::stale;
  }
  Replica& rep = it->second;
  account(rep.entries, -1);
  rep.entries = r.entries;
  rep.seq = r.seq;
  rep.seen_ms = steady_now_ms;
  account(rep.entries, 1);
  write_changed();
  return Applied::applied;
}

std::size_t ClusterLoad::expire(std::int64_t steady_now_ms) {
  std::size_t n = 0;
  for (auto it = replicas_.begin(); it != replicas_.end();) {
    auto next = std::next(it);
    if (steady_now_ms - it->second.seen_ms > limits_.expiry_ms) {
      forget(it);
      ++n;
    }
    it = next;
  }
  if (n != 0)
    write_changed();
  return n;
}

void ClusterLoad::clear() {
  while (!replicas_.empty())
    forget(replicas_.begin());
  write_changed();
}

void ClusterLoad::forget(std::unordered_map<std::uint64_t, Replica>::iterator it) {
  account(it->second.entries, -1);
  replicas_.erase(it);
}

void ClusterLoad::account(const std::vector<LoadEntry>& entries, int sign) {
  for (const auto& e : entries) {
    LoadEntry& t = totals_[e.instance];
    t.instance = e.instance;
    t.in_flight += sign * e.in_flight;
    t.queued_tokens += sign * e.queued_tokens;
    changed_.push_back(e.instance);
  }
}

void ClusterLoad::write_changed() {
  if (changed_.empty())
    return;
  std::sort(changed_.begin(), changed_.end());
  changed_.erase(std::unique(changed_.begin(), changed_.end()), changed_.end());
  for (const InstanceKey key : changed_) {
    write(key);
    auto t = totals_.find(key);
    if (t != totals_.end() && t->second.in_flight == 0 && t->second.queued_tokens == 0)
      totals_.erase(t);
  }
  changed_.clear();
}

std::size_t ClusterLoad::busy_before(std::uint64_t own_origin) const {
  std::size_t n = 0;
  for (const auto& [origin, rep] : replicas_) {
    if (origin < own_origin && !rep.entries.empty())
      ++n;
  }
  return n;
}

LoadEntry ClusterLoad::total(InstanceKey key) const {
  auto it = totals_.find(key);
  return it == totals_.end() ? LoadEntry{key, 0, 0} : it->second;
}

}  // namespace pdgate
