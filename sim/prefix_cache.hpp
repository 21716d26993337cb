// Automatic prefix caching, vLLM style: a prompt is cut into full blocks of
// block_size tokens (4*block_size bytes of prefix text); block i is keyed by
// a hash chained over blocks 0..i, so a block only matches when everything
// before it matched too. The cache is LRU-bounded to a number of blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pdgate::sim {

// What an insert changed, as a KV event consumer must see it: chain
// positions newly cached, and blocks evicted that were cached before the
// insert and are gone after it. A block evicted and re-added within the same
// insert is in neither (no net change).
struct CacheChanges {
  std::vector<std::size_t> stored;     // indices into the inserted chain, ascending
  std::vector<std::uint64_t> removed;  // hashes, in eviction order
  bool empty() const { return stored.empty() && removed.empty(); }
};

class PrefixCache {
 public:
  PrefixCache(std::size_t block_size_tokens, std::size_t capacity_blocks, bool enabled = true);

  // Chained hashes of the text's full blocks (a partial tail block has none).
  // `lora`: the LoRA adapter computing them (empty: the base model); its
  // blocks are other KV, so the chain starts from its name, as vLLM's
  // block hashes take the adapter in their extra keys.
  std::vector<std::uint64_t> block_hashes(std::string_view text, std::string_view lora = {}) const;

  // Number of leading blocks present; those become most recently used.
  std::size_t match(const std::vector<std::uint64_t>& hashes);

  // Inserts (or refreshes) every block and returns their ids in chain order.
  // Blocks are touched last-to-first so that, like vLLM freeing a request's
  // blocks in reverse, a chain's tail is evicted before its head.
  // With `changes`, also reports what the insert changed.
  std::vector<std::int64_t> insert(const std::vector<std::uint64_t>& hashes,
                                   CacheChanges* changes = nullptr);

  // Drops every block (vLLM's /reset_prefix_cache).
  void clear();

  bool contains(std::uint64_t hash) const { return index_.count(hash) != 0; }

  // An id that no cached block uses: for partial tail blocks in kv params.
  std::int64_t fresh_block_id() { return next_id_++; }

  std::size_t size() const { return lru_.size(); }
  std::size_t capacity() const { return capacity_; }
  std::size_t block_size() const { return block_size_; }
  bool enabled() const { return enabled_; }

 private:
  struct Entry {
    std::uint64_t hash;
    std::int64_t id;
  };
  void touch(std::list<Entry>::iterator it) { lru_.splice(lru_.begin(), lru_, it); }

  std::size_t block_size_;
  std::size_t capacity_;
  bool enabled_;
  std::int64_t next_id_ = 1;
  std::list<Entry> lru_;  // front = most recently used
  std::unordered_map<std::uint64_t, std::list<Entry>::iterator> index_;
};

// Tokens a request may skip given its matched leading blocks. Like vLLM, at
// least the last prompt token is always computed, so a full hit is capped.
std::size_t cached_prefix_tokens(std::size_t matched_blocks, std::size_t block_size,
                                 std::size_t prompt_tokens);

}  // namespace pdgate::sim
