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
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/base/result.hpp"

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

}  // namespace pdgate::policy
