#include "plugins/memory_conversation_store.hpp"

#include "plugins/conversation_stores.hpp"

#include <algorithm>

#include "plugins/redis_conversation_store.hpp"
#include "plugins/redis_protocol.hpp"

namespace pdgate {

ConversationMap::ConversationMap(std::size_t capacity, ConversationCounters& counters)
    : capacity_(std::max<std::size_t>(capacity, 1)), counters_(counters) {}

void ConversationMap::erase(std::unordered_map<std::string, Entry>::iterator it) {
  order_.erase(it->second.lru);
  entries_.erase(it);
}

TakeResult ConversationMap::take(const std::string& id, Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    counters_.add(counters_.misses_none);
    return TakeResult::miss();
  }
  if (it->second.expires_at <= now) {
    // The decode has freed (or is about to free) these blocks: pulling
    // them would fail, so the turn recomputes instead.
    erase(it);
    counters_.add(counters_.expired);
    counters_.add(counters_.misses_none);
    return TakeResult::miss();
  }
  std::string params = std::move(it->second.params);
  erase(it);
  return TakeResult::hit(std::move(params));
}

void ConversationMap::put(const std::string& id, std::string params, Clock::time_point now,
                          std::chrono::seconds ttl) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end())
    erase(it);
  order_.push_front(id);
  entries_.emplace(id, Entry{std::move(params), now + ttl, order_.begin()});
  counters_.add(counters_.puts);
  // With one TTL for all, the least recently stored entry expires first:
  // dropping expired ones from the back keeps the map at its live size
  // without a timer.
  while (!order_.empty()) {
    auto last = entries_.find(order_.back());
    const bool expired = last->second.expires_at <= now;
    if (!expired && entries_.size() <= capacity_)
      break;
    // A live entry dropped for room lost its turn before it came: that is
    // worth a counter of its own (the cap is too small for the traffic).
    counters_.add(expired ? counters_.expired : counters_.evicted);
    erase(last);
  }
}

std::size_t ConversationMap::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

namespace {

// A worker's handle on the shared map. The mutex is held for a hash lookup
// and a list splice: shorter than any I/O, so no need to leave the loop.
class MemoryConversationStore final : public ConversationStore {
 public:
  explicit MemoryConversationStore(MemoryConversationStores& shared) : shared_(shared) {}

  net::awaitable<TakeResult> take(std::string conversation_id) override {
    co_return shared_.map().take(conversation_id, ConversationMap::Clock::now());
  }

  net::awaitable<bool> put(std::string conversation_id, std::string params_json,
                           std::chrono::seconds ttl) override {
    if (params_json.size() > shared_.max_value_bytes())
      co_return false;
    shared_.map().put(conversation_id, std::move(params_json), ConversationMap::Clock::now(), ttl);
    co_return true;
  }

 private:
  MemoryConversationStores& shared_;
};

}  // namespace

MemoryConversationStores::MemoryConversationStores(const ConversationStoreOptions& options)
    : map_(options.memory_capacity, counters_), max_value_bytes_(options.max_value_bytes) {}

std::unique_ptr<ConversationStore> MemoryConversationStores::make_handle(net::any_io_executor) {
  return std::make_unique<MemoryConversationStore>(*this);
}

ConversationStoreHealth MemoryConversationStores::health() const {
  return {"memory", "", true, map_.size()};
}

Result<std::unique_ptr<ConversationStores>> make_conversation_stores(
    const ConversationStoreOptions& options, RedisClientContext redis) {
  if (options.redis_url.empty()) {
    return std::unique_ptr<ConversationStores>(std::make_unique<MemoryConversationStores>(options));
  }
  auto endpoint = parse_redis_url(options.redis_url);
  if (!endpoint)
    return fail(endpoint.error());
  return std::unique_ptr<ConversationStores>(
      std::make_unique<RedisConversationStores>(options, std::move(*endpoint), std::move(redis)));
}

}  // namespace pdgate
