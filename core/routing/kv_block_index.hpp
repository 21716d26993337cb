// Which KV blocks each engine instance holds, exactly, as its own KV
// events say (core/routing/kv_events.hpp, docs/kv-events.md). Blocks are keyed by
// pdgate's own chained hash over token ids, h = H(parent h, block tokens),
// so the engines' hash seed and algorithm do not matter: a request's token
// ids give the same chain on this side. Per instance, the engine's hash of
// each block maps to pdgate's, to follow parent_block_hash and
// BlockRemoved.
//
// Not every stored block is a prefix block (docs/kv-events.md, "What is
// indexed"): only blocks of full-attention KV-cache groups are kept, keyed
// per group, on the GPU or the engine's CPU offload; a LoRA adapter's blocks
// chain from a root of their own, so only a request naming that adapter
// matches them; blocks keyed by more than their tokens (extra_keys:
// images, cache_salt) chain from a hash no token-only request reaches.
//
// One thread (the event ingestion) writes; policies read inside a pick
// from any worker. A reader takes shared locks only: the instance table's
// and one instance's at a time. Memory is bounded: blocks past the cap of
// an instance or of all instances are dropped and counted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/routing/kv_events.hpp"
#include "core/routing/kv_location_index.hpp"

namespace pdgate {

// How far an instance's blocks can be trusted (docs/kv-events.md).
enum class KvFeedState {
  exact,     // every event so far was received (or a gap was repaired)
  degraded,  // not heard from yet, or a gap is being repaired by replay
  fallback,  // a gap could not be repaired: its blocks are not used
};
const char* to_string(KvFeedState s);

// pdgate's chain of block hashes over `tokens`, one per whole block of
// `block_size` tokens (a trailing partial block has none); `lora_name`
// empty: the base model's blocks.
std::vector<std::uint64_t> token_block_chain(std::span<const std::uint32_t> tokens,
                                             std::uint32_t block_size,
                                             std::string_view lora_name = {});

// Media whose blocks count as cached on the engine that published them:
// its GPU (or an engine before `medium`) and its own CPU offload (vLLM's
// OffloadingConnector loads them back instead of computing them). Others
// (shared storage, unknown media) are not indexed.
bool is_indexed_medium(const std::optional<std::string>& medium);

struct KvBlockIndexLimits {
  std::size_t blocks_per_instance = 262'144;
  std::size_t total_blocks = 2'000'000;
  std::size_t lora_names = 1'024;  // adapter names remembered (past it, requests match base blocks)
};

struct KvCachedTokens {
  InstanceKey key = 0;
  std::size_t tokens = 0;  // leading tokens of the request cached there
  bool exact = false;      // false: its feed is not exact; use the approximate index
};

struct KvInstanceBlocks {
  InstanceKey key = 0;
  std::size_t blocks = 0;
  std::uint32_t block_size = 0;
  KvFeedState state = KvFeedState::degraded;
  std::uint64_t dropped = 0;  // blocks not kept: over a cap, or an unknown parent
  // Blocks not indexed by design: of a group that is not full attention,
  // or on a medium that is not this engine's.
  std::uint64_t ignored_group = 0;
  std::uint64_t ignored_medium = 0;
};

class KvBlockIndex {
 public:
  explicit KvBlockIndex(KvBlockIndexLimits limits = {}) : limits_(limits) {}

  // Events from one instance, in order. Makes the instance known.
  void apply(InstanceKey key, const KvEvent& event);
  // Drops every block of the instance (a gap that could not be repaired,
  // or the instance left) and sets its state.
  void clear(InstanceKey key, KvFeedState state);
  void set_state(InstanceKey key, KvFeedState state);
  void forget(InstanceKey key);

  // For every known instance: how many leading tokens of `tokens` it holds
  // in whole blocks. An instance not exact reports 0 and exact = false.
  // `model` is the request's (PickContext::model): when it names a LoRA
  // adapter some engine stored blocks for, only that adapter's blocks
  // match; otherwise only the base model's.
  std::vector<KvCachedTokens> cached_tokens(std::span<const std::uint32_t> tokens,
                                            std::string_view model = {}) const;

  std::vector<KvInstanceBlocks> instances() const;
  std::size_t total_blocks() const { return total_.load(std::memory_order_relaxed); }
  std::uint64_t dropped_total() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  struct Shard {
    mutable std::shared_mutex mu;
    struct Entry {
      std::uint64_t own = 0;
      std::uint32_t refs = 0;  // a block stored again (another medium) is removed twice
    };
    // An engine hash within its KV-cache group: groups of one engine hash
    // the same tokens alike, and each group stores and evicts on its own.
    struct Key {
      std::uint32_t group = 0;
      EngineBlockHash hash = 0;
      bool operator==(const Key&) const = default;
    };
    struct KeyHash {
      std::size_t operator()(const Key& k) const {
        return static_cast<std::size_t>(k.hash ^ (k.group * 0x9e3779b97f4a7c15ull));
      }
    };
    std::unordered_map<Key, Entry, KeyHash> by_engine;
    std::unordered_map<std::uint64_t, std::uint32_t> own;  // own hash -> engine hashes naming it
    // Each group's kind as its stored events said: true for full attention.
    // Bounded by the decoder's max_group_idx (and kMaxGroups here).
    std::unordered_map<std::uint32_t, bool> group_full;
    std::uint32_t block_size = 0;
    std::atomic<KvFeedState> state{KvFeedState::degraded};
    std::atomic<std::uint64_t> dropped{0};
    std::atomic<std::uint64_t> ignored_group{0};
    std::atomic<std::uint64_t> ignored_medium{0};
  };

  std::shared_ptr<Shard> shard(InstanceKey key) const;
  std::shared_ptr<Shard> shard_or_create(InstanceKey key);
  void stored(Shard& s, const KvBlockStored& e);
  void removed(Shard& s, const KvBlockRemoved& e);
  void drop_all(Shard& s);
  void count_drop(Shard& s, std::uint64_t n);
  bool full_attention(Shard& s, const KvBlockStored& e);
  void remember_lora(const std::string& name);
  bool is_lora(std::string_view model) const;

  const KvBlockIndexLimits limits_;
  mutable std::shared_mutex mu_;
  std::unordered_map<InstanceKey, std::shared_ptr<Shard>> shards_;
  std::atomic<std::size_t> total_{0};
  std::atomic<std::uint64_t> dropped_{0};
  // Adapter names seen in stored events, on any instance: how a request's
  // model is told to be an adapter (vLLM serves both under one name space).
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  mutable std::shared_mutex lora_mu_;
  std::unordered_set<std::string, NameHash, std::equal_to<>> lora_names_;
};

}  // namespace pdgate
