// Publishing the prefix cache's changes as KV events (cache_events.hpp).
#include "sim/cache_events.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstddef>
#include <utility>

#include "sim/kv_event_publisher.hpp"
#include "sim/tokenizer.hpp"

namespace pdgate::sim {

// Evictions first (vLLM evicts to make room before it stores), then one
// BlockStored per run of consecutive new blocks, whose parent is the block
// before the run.
std::vector<std::int64_t> CacheEvents::insert(std::string_view text,
                                              const std::vector<std::uint64_t>& hashes,
                                              std::string_view lora) {
  if (events_ == nullptr)
    return cache_.insert(hashes);
  CacheChanges changes;
  std::vector<std::int64_t> ids = cache_.insert(hashes, &changes);
  if (changes.empty())
    return ids;
  std::vector<KvEvent> events;
  // Every group of a hybrid model caches the same blocks of a prompt in
  // its own pages, and vLLM reports each group's on their own.
  const auto& groups = opts_.kv_cache_groups;
  if (!changes.removed.empty()) {
    for (const CacheGroup& g : groups)
      events.emplace_back(BlockRemoved{changes.removed, g.idx});
  }
  std::int64_t lora_id = 0;
  for (std::size_t i = 0; i < opts_.lora_modules.size(); ++i) {
    if (opts_.lora_modules[i] == lora)
      lora_id = static_cast<std::int64_t>(i) + 1;
  }
  const std::size_t bs = cache_.block_size();
  const std::size_t block_bytes = bs * kBytesPerToken;
  const auto& stored = changes.stored;
  for (std::size_t i = 0; i < stored.size();) {
    std::size_t end = i + 1;
    while (end < stored.size() && stored[end] == stored[end - 1] + 1)
      ++end;
    const std::size_t first = stored[i];
    const std::size_t count = end - i;
    BlockStored event;
    event.block_hashes.assign(hashes.begin() + static_cast<std::ptrdiff_t>(first),
                              hashes.begin() + static_cast<std::ptrdiff_t>(first + count));
    if (first > 0)
      event.parent_block_hash = hashes[first - 1];
    event.token_ids = token_ids(text.substr(first * block_bytes, count * block_bytes));
    event.block_size = bs;
    event.lora_name = std::string(lora);
    event.lora_id = lora_id;
    for (const CacheGroup& g : groups) {
      event.group = g;
      events.emplace_back(event);
    }
    i = end;
  }
  publish(events);
  return ids;
}

void CacheEvents::clear() {
  cache_.clear();
  if (events_ != nullptr)
    publish({AllBlocksCleared{}});
}

void CacheEvents::publish(const std::vector<KvEvent>& events) {
  const double ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // This core's data-parallel rank (0 without data parallelism).
  if (!events_->publish(encode_batch(ts, events, static_cast<int>(opts_.data_parallel_rank),
                                     opts_.kv_events_format, opts_.kv_events_hash))) {
    log_.warn("kv events: queue full ({} batches), a batch was dropped",
              opts_.kv_events.max_queue_size);
  }
}

}  // namespace pdgate::sim
