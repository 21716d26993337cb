#include "sim/kv_registry.hpp"

namespace pdgate::sim {

const char* to_string(KvResult r) {
  switch (r) {
    case KvResult::none:
      return "none";
    case KvResult::valid:
      return "valid";
    case KvResult::reused:
      return "reused";
    case KvResult::unknown:
      return "unknown";
    case KvResult::pull_failed:
      return "pull_failed";
  }
  return "?";
}

std::optional<std::vector<std::int64_t>> flatten_block_ids(const nlohmann::json& v) {
  if (!v.is_array())
    return std::nullopt;
  std::vector<std::int64_t> out;
  for (const auto& e : v) {
    if (e.is_number_integer()) {
      out.push_back(e.get<std::int64_t>());
    } else if (e.is_array()) {
      for (const auto& x : e) {
        if (!x.is_number_integer())
          return std::nullopt;
        out.push_back(x.get<std::int64_t>());
      }
    } else {
      return std::nullopt;
    }
  }
  return out;
}

KvRegistry::KvRegistry(std::string engine_id, std::chrono::seconds ttl, std::size_t max_entries)
    : engine_id_(std::move(engine_id)),
      ttl_(ttl),
      max_entries_(max_entries == 0 ? 1 : max_entries) {}

void KvRegistry::erase_entry(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end())
    return;
  if (!it->second.consumed) {
    --outstanding_;
    outstanding_blocks_ -= it->second.block_ids.size();
  }
  entries_.erase(it);
}

void KvRegistry::expire(Clock::time_point now) {
  while (!order_.empty()) {
    const auto& [id, at] = order_.front();
    auto it = entries_.find(id);
    const bool stale = it == entries_.end() || it->second.issued_at != at;
    if (!stale) {
      const bool too_old = now >= it->second.expires_at;
      const bool over_bound = entries_.size() > max_entries_;
      if (!too_old && !over_bound)
        break;
      erase_entry(id);
    }
    order_.pop_front();
  }
}

void KvRegistry::issue(const std::string& request_id, std::vector<std::int64_t> block_ids,
                       Clock::time_point now, std::optional<Clock::duration> ttl) {
  erase_entry(request_id);  // ids should be unique; a re-issue replaces the old entry
  outstanding_ += 1;
  outstanding_blocks_ += block_ids.size();
  entries_[request_id] = Entry{std::move(block_ids), now, now + ttl.value_or(ttl_), false};
  order_.emplace_back(request_id, now);
  expire(now);
}

KvResult KvRegistry::consume(const std::string& engine_id, const std::string& request_id,
                             const std::vector<std::int64_t>& block_ids, Clock::time_point now) {
  return take(engine_id, request_id, &block_ids, now);
}

KvResult KvRegistry::consume_held(const std::string& engine_id, const std::string& request_id,
                                  Clock::time_point now) {
  return take(engine_id, request_id, nullptr, now);
}

KvResult KvRegistry::take(const std::string& engine_id, const std::string& request_id,
                          const std::vector<std::int64_t>* block_ids, Clock::time_point now) {
  expire(now);
  if (engine_id != engine_id_)
    return KvResult::unknown;
  auto it = entries_.find(request_id);
  if (it == entries_.end())
    return KvResult::unknown;
  if (it->second.expires_at <= now)
    return KvResult::unknown;  // the lease ran out: the blocks are freed
  if (block_ids && it->second.block_ids != *block_ids)
    return KvResult::unknown;
  if (it->second.consumed)
    return KvResult::reused;
  it->second.consumed = true;
  --outstanding_;
  outstanding_blocks_ -= it->second.block_ids.size();
  return KvResult::valid;
}

std::size_t KvRegistry::outstanding(Clock::time_point now) {
  expire(now);
  return outstanding_;
}

std::size_t KvRegistry::outstanding_blocks(Clock::time_point now) {
  expire(now);
  return outstanding_blocks_;
}

std::size_t KvRegistry::size(Clock::time_point now) {
  expire(now);
  return entries_.size();
}

}  // namespace pdgate::sim
