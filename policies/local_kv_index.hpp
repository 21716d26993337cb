// The in-process KvLocationIndex (core/routing/kv_location_index.hpp): what this
// gateway knows, in memory. Used alone by a single gateway, and as the
// local copy that a shared index (plugins/redis_kv_index.hpp) feeds with
// the records of every replica. Bounded in memory; each part has its own
// locks, held for a few map operations, far below a pick's budget.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/routing/kv_location_index.hpp"

namespace pdgate::policy {

// Bounded by two generations: when the current map fills half the cap it
// becomes the previous one and the old previous is dropped, so memory stays
// under the cap and recently used entries survive (an approximate LRU with
// O(1) work per operation).
class ConversationTable {
 public:
  explicit ConversationTable(std::size_t capacity = 65536)
      : half_(std::max<std::size_t>(capacity / 2, 1)) {}
  std::optional<ConversationRoute> get(std::string_view id) const;
  void put(std::string_view id, const ConversationRoute& e);

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, ConversationRoute> cur_, prev_;
  const std::size_t half_;
};

// For each prefix block hash, the few instances it was routed to most
// recently. Sharded by hash so workers rarely contend.
class PrefixIndex {
 public:
  // capacity: block entries kept in all (approximately); ttl_ms: older
  // routes no longer count as cached (the engine has likely evicted them).
  PrefixIndex(std::size_t capacity = 1u << 20, std::int64_t ttl_ms = 600'000);
  void record(const std::vector<std::uint64_t>& hashes, InstanceKey instance, std::int64_t now_ms);
  std::vector<std::pair<InstanceKey, std::size_t>> matches(const std::vector<std::uint64_t>& hashes,
                                                           std::int64_t now_ms,
                                                           std::size_t enough) const;
  // Routes to `instance` recorded up to `now_ms` stop counting.
  void forget(InstanceKey instance, std::int64_t now_ms);

  std::int64_t ttl_ms() const { return ttl_ms_; }

  static constexpr std::size_t kWays = 4;  // instances remembered per block
  // Forgotten instances remembered per shard; a removal older than the
  // TTL needs no entry (the routes it hides have expired anyway).
  static constexpr std::size_t kMaxForgotten = 64;

 private:
  struct Route {
    InstanceKey instance = 0;
    std::int64_t at_ms = 0;
  };
  using Routes = std::array<Route, kWays>;
  struct Forgotten {
    InstanceKey instance = 0;
    std::int64_t at_ms = 0;
  };
  struct Shard {
    mutable std::mutex mu;
    std::unordered_map<std::uint64_t, Routes> cur, prev;
    // Checked by matches() under the same lock: removals are rare, so
    // this is almost always empty and a purge costs nothing up front
    // instead of a scan of every entry.
    std::vector<Forgotten> forgotten;
  };
  bool hidden(const Shard& s, const Route& r, std::int64_t now_ms) const;

  static constexpr std::size_t kShards = 16;
  std::array<Shard, kShards> shards_;
  const std::size_t half_per_shard_;
  const std::int64_t ttl_ms_;
};

class LocalKvIndex final : public KvLocationIndex {
 public:
  explicit LocalKvIndex(std::size_t prefix_capacity = 1u << 20,
                        std::int64_t prefix_ttl_ms = 600'000,
                        std::size_t conversation_capacity = 65536)
      : prefixes_(prefix_capacity, prefix_ttl_ms), conversations_(conversation_capacity) {}

  void record_prefix(const std::vector<std::uint64_t>& hashes, InstanceKey where,
                     std::int64_t now_ms) override {
    prefixes_.record(hashes, where, now_ms);
  }
  std::vector<std::pair<InstanceKey, std::size_t>> prefix_matches(
      const std::vector<std::uint64_t>& hashes, std::int64_t now_ms,
      std::size_t enough) const override {
    return prefixes_.matches(hashes, now_ms, enough);
  }
  void record_conversation(std::string_view id, const ConversationRoute& route) override {
    conversations_.put(id, route);
  }
  std::optional<ConversationRoute> conversation(std::string_view id) const override {
    return conversations_.get(id);
  }
  void forget_instance(InstanceKey key, std::int64_t now_ms) override {
    prefixes_.forget(key, now_ms);
  }

  std::int64_t prefix_ttl_ms() const { return prefixes_.ttl_ms(); }

 private:
  PrefixIndex prefixes_;
  ConversationTable conversations_;
};

}  // namespace pdgate::policy
