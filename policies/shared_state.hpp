// State that policies share across worker threads: a small key/value
// store, the table of which instances served each conversation, and an
// approximate index of which instances recently received which prefix
// blocks. Each is bounded in memory and protected by its own mutex; the
// critical sections are a few map operations, far below a pick's budget.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/result.hpp"

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
  // Adds to a number (absent counts as 0) and returns the new value.
  Result<double> incr(std::string_view key, double delta, std::int64_t now_ms);
  void erase(std::string_view key);
  std::size_t bytes() const;

 private:
  struct Entry {
    KvValue value;
    std::int64_t expires_ms = 0;  // 0: never
  };
  static std::size_t cost(std::string_view key, const KvValue& v);
  void erase_locked(std::unordered_map<std::string, Entry>::iterator it);

  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> map_;
  std::size_t bytes_ = 0;
  const std::size_t max_bytes_;
};

// Which decode (and prefill) served a conversation's last turn.
struct ConversationEntry {
  std::uint64_t decode = 0;   // instance id, 0 if none
  std::uint64_t prefill = 0;  // instance id, 0 if none
  std::int64_t at_ms = 0;
};

// Bounded by two generations: when the current map fills half the cap it
// becomes the previous one and the old previous is dropped, so memory stays
// under the cap and recently used entries survive (an approximate LRU with
// O(1) work per operation).
class ConversationTable {
 public:
  explicit ConversationTable(std::size_t capacity = 65536)
      : half_(std::max<std::size_t>(capacity / 2, 1)) {}
  std::optional<ConversationEntry> get(std::string_view id);
  void put(std::string_view id, const ConversationEntry& e);

 private:
  std::mutex mu_;
  std::unordered_map<std::string, ConversationEntry> cur_, prev_;
  const std::size_t half_;
};

// For each prefix block hash, the few instances it was routed to most
// recently. Sharded by hash so workers rarely contend.
class PrefixIndex {
 public:
  // capacity: block entries kept in all (approximately); ttl_ms: older
  // routes no longer count as cached (the engine has likely evicted them).
  PrefixIndex(std::size_t capacity = 1u << 20, std::int64_t ttl_ms = 600'000);
  void record(const std::vector<std::uint64_t>& hashes, std::uint64_t instance_id,
              std::int64_t now_ms);
  // For each instance that recently received a prefix of `hashes`, the
  // number of leading blocks it received. Stops early once `enough`
  // instances are found.
  std::vector<std::pair<std::uint64_t, std::size_t>> matches(
      const std::vector<std::uint64_t>& hashes, std::int64_t now_ms, std::size_t enough) const;

  static constexpr std::size_t kWays = 4;  // instances remembered per block

 private:
  struct Route {
    std::uint64_t instance = 0;
    std::int64_t at_ms = 0;
  };
  using Routes = std::array<Route, kWays>;
  struct Shard {
    mutable std::mutex mu;
    std::unordered_map<std::uint64_t, Routes> cur, prev;
  };
  static constexpr std::size_t kShards = 16;
  std::array<Shard, kShards> shards_;
  const std::size_t half_per_shard_;
  const std::int64_t ttl_ms_;
};

}  // namespace pdgate::policy
