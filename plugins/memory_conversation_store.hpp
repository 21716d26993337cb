// The in-memory conversation store: one bounded map per gateway process,
// shared by its workers. Good for a single replica; params do not survive
// a restart and are not seen by other replicas (use Redis for that).
#pragma once

#include <chrono>
#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/routing/conversation_store.hpp"

namespace pdgate {

// The map itself, with time passed in so TTL and eviction are unit-tested
// without sleeping. Bounded twice: entries expire, and past `capacity` the
// least recently stored entry is evicted (a flood of one-turn conversations
// must not grow the gateway without bound).
class ConversationMap {
 public:
  using Clock = std::chrono::steady_clock;

  ConversationMap(std::size_t capacity, ConversationCounters& counters);

  // Hit (entry removed), miss, or expired (removed, counted, reported as miss).
  TakeResult take(const std::string& id, Clock::time_point now);
  // Replaces any entry of `id`; then drops expired entries from the back
  // and, past the capacity, evicts the least recently stored live ones.
  void put(const std::string& id, std::string params, Clock::time_point now,
           std::chrono::seconds ttl);
  std::size_t size() const;

 private:
  struct Entry {
    std::string params;
    Clock::time_point expires_at;
    std::list<std::string>::iterator lru;  // position in order_
  };
  void erase(std::unordered_map<std::string, Entry>::iterator it);

  const std::size_t capacity_;
  ConversationCounters& counters_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  // Most recently stored at the front; eviction and the expiry sweep take
  // from the back.
  std::list<std::string> order_;
};

class MemoryConversationStores final : public ConversationStores {
 public:
  explicit MemoryConversationStores(const ConversationStoreOptions& options);
  std::unique_ptr<ConversationStore> make_handle(net::any_io_executor worker) override;
  ConversationStoreHealth health() const override;
  ConversationMap& map() { return map_; }
  std::size_t max_value_bytes() const { return max_value_bytes_; }

 private:
  ConversationMap map_;
  std::size_t max_value_bytes_;
};

}  // namespace pdgate
