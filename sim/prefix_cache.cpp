#include "sim/prefix_cache.hpp"

#include <algorithm>
#include <unordered_set>

#include "sim/tokenizer.hpp"

namespace pdgate::sim {

PrefixCache::PrefixCache(std::size_t block_size_tokens, std::size_t capacity_blocks, bool enabled)
    : block_size_(std::max<std::size_t>(1, block_size_tokens)),
      capacity_(std::max<std::size_t>(1, capacity_blocks)),
      enabled_(enabled) {}

std::vector<std::uint64_t> PrefixCache::block_hashes(std::string_view text,
                                                     std::string_view lora) const {
  const std::size_t block_bytes = block_size_ * kBytesPerToken;
  std::vector<std::uint64_t> out;
  out.reserve(text.size() / block_bytes);
  std::uint64_t h = lora.empty() ? 14695981039346656037ull : fnv1a64(lora);
  for (std::size_t off = 0; off + block_bytes <= text.size(); off += block_bytes) {
    // Chaining: the previous hash is the FNV basis of the next block.
    h = fnv1a64(text.substr(off, block_bytes), h);
    out.push_back(h);
  }
  return out;
}

std::size_t PrefixCache::match(const std::vector<std::uint64_t>& hashes) {
  if (!enabled_)
    return 0;
  std::size_t n = 0;
  while (n < hashes.size() && index_.count(hashes[n]) != 0)
    ++n;
  for (std::size_t i = n; i-- > 0;)
    touch(index_[hashes[i]]);
  return n;
}

std::vector<std::int64_t> PrefixCache::insert(const std::vector<std::uint64_t>& hashes,
                                              CacheChanges* changes) {
  // Ids are drawn in chain order (readable, ascending kv params); the LRU
  // update then runs tail-first so the chain's head ends most recently used.
  std::vector<std::int64_t> ids(hashes.size());
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    auto it = enabled_ ? index_.find(hashes[i]) : index_.end();
    ids[i] = it != index_.end() ? it->second->id : next_id_++;
  }
  if (!enabled_)
    return ids;
  std::vector<bool> cached_before;
  std::vector<std::uint64_t> evicted;
  if (changes != nullptr) {
    cached_before.resize(hashes.size());
    for (std::size_t i = 0; i < hashes.size(); ++i)
      cached_before[i] = index_.count(hashes[i]) != 0;
  }
  for (std::size_t i = hashes.size(); i-- > 0;) {
    if (auto it = index_.find(hashes[i]); it != index_.end()) {
      touch(it->second);
      continue;
    }
    // Also reached when an earlier step of this loop evicted a block of this
    // very chain: it comes back under the id it had.
    lru_.push_front(Entry{hashes[i], ids[i]});
    index_[hashes[i]] = lru_.begin();
    while (lru_.size() > capacity_) {
      if (changes != nullptr)
        evicted.push_back(lru_.back().hash);
      index_.erase(lru_.back().hash);
      lru_.pop_back();
    }
  }
  if (changes != nullptr) {
    std::unordered_set<std::uint64_t> added;
    for (std::size_t i = 0; i < hashes.size(); ++i) {
      if (!cached_before[i] && added.insert(hashes[i]).second && contains(hashes[i]))
        changes->stored.push_back(i);
    }
    std::unordered_set<std::uint64_t> reported;
    for (std::uint64_t h : evicted) {
      // Blocks this insert added and evicted again were never announced.
      if (!contains(h) && added.count(h) == 0 && reported.insert(h).second)
        changes->removed.push_back(h);
    }
  }
  return ids;
}

void PrefixCache::clear() {
  lru_.clear();
  index_.clear();
}

std::size_t cached_prefix_tokens(std::size_t matched_blocks, std::size_t block_size,
                                 std::size_t prompt_tokens) {
  if (prompt_tokens == 0 || block_size == 0)
    return 0;
  const std::size_t max_blocks = (prompt_tokens - 1) / block_size;
  return std::min(matched_blocks, max_blocks) * block_size;
}

}  // namespace pdgate::sim
