#include "core/routing/kv_block_index.hpp"

#include <algorithm>
#include <mutex>
#include <type_traits>

namespace pdgate {

const char* to_string(KvFeedState s) {
  switch (s) {
    case KvFeedState::exact:
      return "exact";
    case KvFeedState::degraded:
      return "degraded";
    case KvFeedState::fallback:
      return "fallback";
  }
  return "?";
}

namespace {

// splitmix64's finalizer: every input bit moves every output bit, so a
// chain over small token ids spreads across the hash tables.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 14695981039346656037ull;
  for (const char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// The chain's root: blocks of different LoRA adapters are different KV.
// An adapter is named (what a request's model says); an older engine's
// lora_id alone gives a root no request reaches, which keeps its blocks
// apart from the base model's all the same.
std::uint64_t name_root(std::string_view lora_name) {
  return mix(lora_name.empty() ? 0 : 0x6c6f72616e616d65ull ^ fnv1a(lora_name));
}

std::uint64_t chain_root(const KvBlockStored& e) {
  if (e.lora_name && !e.lora_name->empty())
    return name_root(*e.lora_name);
  if (e.lora_id)
    return mix(0x6c6f7261u ^ mix(static_cast<std::uint64_t>(*e.lora_id)));
  return name_root({});
}

// Group kinds an engine may create at most per instance (the decoder
// refuses larger group_idx; this bounds direct callers too).
constexpr std::size_t kMaxGroups = 1024;

std::uint64_t block_hash(std::uint64_t parent, std::span<const std::uint32_t> block) {
  std::uint64_t h = mix(parent ^ block.size());
  for (const std::uint32_t t : block)
    h = mix(h ^ t);
  return h;
}

}  // namespace

bool is_full_attention_kind(std::string_view kind) {
  return kind == "full_attention" || kind == "mla_attention" || kind == "sink_full_attention";
}

bool is_indexed_medium(const std::optional<std::string>& medium) {
  return !medium || *medium == "GPU" || *medium == "CPU";
}

std::vector<std::uint64_t> token_block_chain(std::span<const std::uint32_t> tokens,
                                             std::uint32_t block_size, std::string_view lora_name) {
  std::vector<std::uint64_t> chain;
  if (block_size == 0)
    return chain;
  chain.reserve(tokens.size() / block_size);
  std::uint64_t h = name_root(lora_name);
  for (std::size_t at = 0; at + block_size <= tokens.size(); at += block_size) {
    h = block_hash(h, tokens.subspan(at, block_size));
    chain.push_back(h);
  }
  return chain;
}

std::shared_ptr<KvBlockIndex::Shard> KvBlockIndex::shard(InstanceKey key) const {
  std::shared_lock lock(mu_);
  const auto it = shards_.find(key);
  return it == shards_.end() ? nullptr : it->second;
}

std::shared_ptr<KvBlockIndex::Shard> KvBlockIndex::shard_or_create(InstanceKey key) {
  if (auto s = shard(key))
    return s;
  std::unique_lock lock(mu_);
  auto& s = shards_[key];
  if (!s)
    s = std::make_shared<Shard>();
  return s;
}

void KvBlockIndex::count_drop(Shard& s, std::uint64_t n) {
  s.dropped.fetch_add(n, std::memory_order_relaxed);
  dropped_.fetch_add(n, std::memory_order_relaxed);
}

// Whether the event's group holds whole prefixes. A kind said is learnt
// for its group (vLLM sends it on stored events only); a group never
// described is full attention: engines before kv_cache_spec_kind had no
// other kind in their events' single group.
bool KvBlockIndex::full_attention(Shard& s, const KvBlockStored& e) {
  const std::uint32_t group = e.group_idx.value_or(0);
  if (e.kv_cache_spec_kind) {
    const bool full = is_full_attention_kind(*e.kv_cache_spec_kind);
    if (s.group_full.size() < kMaxGroups || s.group_full.contains(group))
      s.group_full[group] = full;
    return full;
  }
  const auto it = s.group_full.find(group);
  return it == s.group_full.end() || it->second;
}

void KvBlockIndex::remember_lora(const std::string& name) {
  {
    std::shared_lock lock(lora_mu_);
    if (lora_names_.contains(name))
      return;
  }
  std::unique_lock lock(lora_mu_);
  if (lora_names_.size() < limits_.lora_names)
    lora_names_.insert(name);
}

bool KvBlockIndex::is_lora(std::string_view model) const {
  if (model.empty())
    return false;
  std::shared_lock lock(lora_mu_);
  return lora_names_.contains(model);
}

void KvBlockIndex::stored(Shard& s, const KvBlockStored& e) {
  if (!is_indexed_medium(e.medium)) {
    s.ignored_medium.fetch_add(e.block_hashes.size(), std::memory_order_relaxed);
    return;
  }
  if (!full_attention(s, e)) {
    s.ignored_group.fetch_add(e.block_hashes.size(), std::memory_order_relaxed);
    return;
  }
  const std::uint32_t group = e.group_idx.value_or(0);
  std::uint64_t parent = chain_root(e);
  if (e.parent) {
    const auto it = s.by_engine.find({group, *e.parent});
    if (it == s.by_engine.end()) {
      // Without the parent the chain cannot be followed: these blocks could
      // never match a request's chain, so they are not kept.
      count_drop(s, e.block_hashes.size());
      return;
    }
    parent = it->second.own;
  }
  if (e.block_size == 0 || e.token_ids.size() != e.block_hashes.size() * e.block_size)
    return;  // the decoder refuses such events; kept safe for direct callers
  if (!e.extra_keys.empty() && e.extra_keys.size() != e.block_hashes.size())
    return;  // likewise
  if (e.lora_name && !e.lora_name->empty())
    remember_lora(*e.lora_name);
  s.block_size = e.block_size;
  const std::span<const std::uint32_t> tokens(e.token_ids);
  for (std::size_t i = 0; i < e.block_hashes.size(); ++i) {
    std::uint64_t own = block_hash(parent, tokens.subspan(i * e.block_size, e.block_size));
    // Keyed by more than its tokens (an image, a cache_salt): a chain no
    // request's token ids reproduce, from this block on, as in the engine.
    if (!e.extra_keys.empty() && e.extra_keys[i] != 0)
      own = mix(own ^ e.extra_keys[i]);
    parent = own;
    auto it = s.by_engine.find({group, e.block_hashes[i]});
    if (it != s.by_engine.end()) {
      ++it->second.refs;
      continue;
    }
    if (s.by_engine.size() >= limits_.blocks_per_instance ||
        total_.load(std::memory_order_relaxed) >= limits_.total_blocks) {
      count_drop(s, e.block_hashes.size() - i);
      return;
    }
    s.by_engine.emplace(Shard::Key{group, e.block_hashes[i]}, Shard::Entry{own, 1});
    ++s.own[own];
    total_.fetch_add(1, std::memory_order_relaxed);
  }
}

void KvBlockIndex::removed(Shard& s, const KvBlockRemoved& e) {
  // A removal from a medium that is not indexed, or of a group that is not
  // (its blocks were never stored here), finds nothing under its key.
  if (!is_indexed_medium(e.medium))
    return;
  const std::uint32_t group = e.group_idx.value_or(0);
  for (const EngineBlockHash h : e.block_hashes) {
    const auto it = s.by_engine.find({group, h});
    if (it == s.by_engine.end() || --it->second.refs > 0)
      continue;
    const auto own = s.own.find(it->second.own);
    if (own != s.own.end() && --own->second == 0)
      s.own.erase(own);
    s.by_engine.erase(it);
    total_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void KvBlockIndex::drop_all(Shard& s) {
  total_.fetch_sub(s.by_engine.size(), std::memory_order_relaxed);
  // Swapped out, not cleared: clear() keeps the buckets' memory.
  std::unordered_map<Shard::Key, Shard::Entry, Shard::KeyHash>().swap(s.by_engine);
  std::unordered_map<std::uint64_t, std::uint32_t>().swap(s.own);
}

void KvBlockIndex::apply(InstanceKey key, const KvEvent& event) {
  const auto s = shard_or_create(key);
  std::unique_lock lock(s->mu);
  std::visit(
      [&](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, KvBlockStored>)
          stored(*s, e);
        else if constexpr (std::is_same_v<T, KvBlockRemoved>)
          removed(*s, e);
        else
          drop_all(*s);
      },
      event);
}

void KvBlockIndex::clear(InstanceKey key, KvFeedState state) {
  const auto s = shard_or_create(key);
  std::unique_lock lock(s->mu);
  drop_all(*s);
  s->state.store(state, std::memory_order_release);
}

void KvBlockIndex::set_state(InstanceKey key, KvFeedState state) {
  shard_or_create(key)->state.store(state, std::memory_order_release);
}

void KvBlockIndex::forget(InstanceKey key) {
  std::shared_ptr<Shard> s;
  {
    std::unique_lock lock(mu_);
    const auto it = shards_.find(key);
    if (it == shards_.end())
      return;
    s = std::move(it->second);
    shards_.erase(it);
  }
  std::unique_lock lock(s->mu);
  drop_all(*s);
}

std::vector<KvCachedTokens> KvBlockIndex::cached_tokens(std::span<const std::uint32_t> tokens,
                                                        std::string_view model) const {
  const std::string_view lora = is_lora(model) ? model : std::string_view();
  std::vector<std::pair<InstanceKey, std::shared_ptr<Shard>>> shards;
  {
    std::shared_lock lock(mu_);
    shards.assign(shards_.begin(), shards_.end());
  }
  std::vector<KvCachedTokens> out;
  out.reserve(shards.size());
  // Instances nearly always share one block size: one chain serves them all.
  std::uint32_t chain_size = 0;
  std::vector<std::uint64_t> chain;
  for (const auto& [key, s] : shards) {
    KvCachedTokens row{key, 0, s->state.load(std::memory_order_acquire) == KvFeedState::exact};
    if (row.exact) {
      std::shared_lock lock(s->mu);
      if (s->block_size != 0) {
        if (s->block_size != chain_size) {
          chain = token_block_chain(tokens, s->block_size, lora);
          chain_size = s->block_size;
        }
        std::size_t n = 0;
        while (n < chain.size() && s->own.contains(chain[n]))
          ++n;
        row.tokens = n * s->block_size;
      }
    }
    out.push_back(row);
  }
  return out;
}

std::vector<KvInstanceBlocks> KvBlockIndex::instances() const {
  std::vector<std::pair<InstanceKey, std::shared_ptr<Shard>>> shards;
  {
    std::shared_lock lock(mu_);
    shards.assign(shards_.begin(), shards_.end());
  }
  std::vector<KvInstanceBlocks> out;
  for (const auto& [key, s] : shards) {
    std::shared_lock lock(s->mu);
    out.push_back({key, s->by_engine.size(), s->block_size, s->state.load(),
                   s->dropped.load(std::memory_order_relaxed),
                   s->ignored_group.load(std::memory_order_relaxed),
                   s->ignored_medium.load(std::memory_order_relaxed)});
  }
  return out;
}

}  // namespace pdgate
