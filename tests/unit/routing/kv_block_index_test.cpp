// The exact KV-block index: blocks stored and removed by an engine's events,
// looked up by a request's token ids.
#include <gtest/gtest.h>

#include <numeric>

#include "core/routing/kv_block_index.hpp"

namespace pdgate {
namespace {

std::vector<std::uint32_t> iota_tokens(std::size_t n, std::uint32_t from = 0) {
  std::vector<std::uint32_t> t(n);
  std::iota(t.begin(), t.end(), from);
  return t;
}

KvBlockStored stored(std::vector<EngineBlockHash> hashes, std::optional<EngineBlockHash> parent,
                     std::vector<std::uint32_t> tokens, std::uint32_t block_size) {
  KvBlockStored s;
  s.block_hashes = std::move(hashes);
  s.parent = parent;
  s.token_ids = std::move(tokens);
  s.block_size = block_size;
  return s;
}

std::size_t tokens_on(const KvBlockIndex& index, InstanceKey key,
                      const std::vector<std::uint32_t>& request) {
  for (const auto& row : index.cached_tokens(request))
    if (row.key == key)
      return row.tokens;
  return 0;
}

// Blocks stored in two events (the second naming the first's last block as parent) match a
// request's leading tokens in whole blocks, whatever the engine's own hashes are.
TEST(KvBlockIndex, ChainedBlocksMatchLeadingTokens) {
  KvBlockIndex index;
  const auto tokens = iota_tokens(64);
  index.apply(7, stored({1001, 1002}, std::nullopt, {tokens.begin(), tokens.begin() + 32}, 16));
  index.apply(7, stored({1003}, 1002, {tokens.begin() + 32, tokens.begin() + 48}, 16));
  index.set_state(7, KvFeedState::exact);
  EXPECT_EQ(tokens_on(index, 7, tokens), 48u);
  // A request that diverges inside the second block holds only the first.
  auto other = tokens;
  other[20] = 999;
  EXPECT_EQ(tokens_on(index, 7, other), 16u);
  // A shorter request matches its whole blocks only.
  EXPECT_EQ(tokens_on(index, 7, iota_tokens(40)), 32u);
}

// The same tokens under another engine's hashes give the same chain: instances are compared on
// pdgate's hash.
TEST(KvBlockIndex, EngineHashesDoNotMatter) {
  KvBlockIndex index;
  const auto tokens = iota_tokens(32);
  index.apply(1, stored({11, 12}, std::nullopt, tokens, 16));
  index.apply(2, stored({0xdeadbeef, 0xfeedface}, std::nullopt, tokens, 16));
  index.set_state(1, KvFeedState::exact);
  index.set_state(2, KvFeedState::exact);
  EXPECT_EQ(tokens_on(index, 1, tokens), 32u);
  EXPECT_EQ(tokens_on(index, 2, tokens), 32u);
}

// BlockRemoved takes a block out (its children no longer count); AllBlocksCleared empties it.
TEST(KvBlockIndex, RemovedAndCleared) {
  KvBlockIndex index;
  const auto tokens = iota_tokens(48);
  index.apply(3, stored({1, 2, 3}, std::nullopt, tokens, 16));
  index.set_state(3, KvFeedState::exact);
  index.apply(3, KvBlockRemoved{{2}});
  EXPECT_EQ(tokens_on(index, 3, tokens), 16u);
  EXPECT_EQ(index.total_blocks(), 2u);
  index.apply(3, KvAllBlocksCleared{});
  EXPECT_EQ(tokens_on(index, 3, tokens), 0u);
  EXPECT_EQ(index.total_blocks(), 0u);
}

// A block stored twice (two media) stays until it is removed twice.
TEST(KvBlockIndex, StoredTwiceRemovedTwice) {
  KvBlockIndex index;
  const auto tokens = iota_tokens(16);
  index.apply(3, stored({5}, std::nullopt, tokens, 16));
  index.apply(3, stored({5}, std::nullopt, tokens, 16));
  index.set_state(3, KvFeedState::exact);
  index.apply(3, KvBlockRemoved{{5}});
  EXPECT_EQ(tokens_on(index, 3, tokens), 16u);
  index.apply(3, KvBlockRemoved{{5}});
  EXPECT_EQ(tokens_on(index, 3, tokens), 0u);
}

// An instance whose feed is not exact reports no tokens and exact = false.
TEST(KvBlockIndex, NotExactReportsNothing) {
  KvBlockIndex index;
  const auto tokens = iota_tokens(16);
  index.apply(4, stored({5}, std::nullopt, tokens, 16));
  auto rows = index.cached_tokens(tokens);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_FALSE(rows[0].exact);
  EXPECT_EQ(rows[0].tokens, 0u);
  index.clear(4, KvFeedState::fallback);
  EXPECT_EQ(index.total_blocks(), 0u);
  EXPECT_EQ(index.instances()[0].state, KvFeedState::fallback);
}

// Blocks whose parent was never seen, or past the per-instance and total caps, are dropped and
// counted; memory stays within the caps.
TEST(KvBlockIndex, CapsAndUnknownParentsDropBlocks) {
  KvBlockIndex index({.blocks_per_instance = 4, .total_blocks = 6});
  index.apply(1, stored({1}, 999, iota_tokens(16), 16));
  EXPECT_EQ(index.total_blocks(), 0u);
  EXPECT_EQ(index.dropped_total(), 1u);
  index.apply(1, stored({1, 2, 3, 4, 5}, std::nullopt, iota_tokens(80), 16));
  EXPECT_EQ(index.total_blocks(), 4u);
  index.apply(2, stored({1, 2, 3}, std::nullopt, iota_tokens(48), 16));
  EXPECT_EQ(index.total_blocks(), 6u);
  EXPECT_EQ(index.dropped_total(), 3u);
  index.forget(1);
  EXPECT_EQ(index.total_blocks(), 2u);
}

std::size_t tokens_for(const KvBlockIndex& index, InstanceKey key,
                       const std::vector<std::uint32_t>& request, std::string_view model) {
  for (const auto& row : index.cached_tokens(request, model))
    if (row.key == key)
      return row.tokens;
  return 0;
}

// A LoRA adapter's blocks are different KV: a request naming the adapter matches only them, a
// base request (or one naming another model) only the base model's.
TEST(KvBlockIndex, LoraBlocksAreApartFromTheBaseModels) {
  KvBlockIndex index;
  const auto tokens = iota_tokens(48);
  auto lora = stored({1, 2, 3}, std::nullopt, tokens, 16);
  lora.lora_name = "ad1";
  lora.lora_id = 1;
  index.apply(1, lora);
  index.apply(2, stored({1}, std::nullopt, {tokens.begin(), tokens.begin() + 16}, 16));
  index.set_state(1, KvFeedState::exact);
  index.set_state(2, KvFeedState::exact);
  EXPECT_EQ(tokens_for(index, 1, tokens, "ad1"), 48u);
  EXPECT_EQ(tokens_for(index, 2, tokens, "ad1"), 0u);
  EXPECT_EQ(tokens_for(index, 1, tokens, "base-model"), 0u);
  EXPECT_EQ(tokens_for(index, 2, tokens, "base-model"), 16u);
  EXPECT_EQ(tokens_for(index, 2, tokens, ""), 16u);
  // An engine before lora_name said only lora_id: its blocks match no request, base or not.
  auto old = stored({9}, std::nullopt, {tokens.begin(), tokens.begin() + 16}, 16);
  old.lora_id = 4;
  index.apply(3, old);
  index.set_state(3, KvFeedState::exact);
  EXPECT_EQ(tokens_for(index, 3, tokens, ""), 0u);
  EXPECT_EQ(tokens_for(index, 3, tokens, "ad1"), 0u);
}

// Only full-attention groups hold prefixes: a sliding-window or mamba group's blocks are not
// indexed (counted as ignored), and the kind a group's stored event said is remembered for its
// later events without one. Groups keep their blocks apart: evicting a hash from the
// sliding-window group (vLLM does, early) leaves the full-attention group's block of the same
// hash. An event without group or kind (an older engine) is full attention.
TEST(KvBlockIndex, OnlyFullAttentionGroupsAreIndexed) {
  KvBlockIndex index;
  const auto tokens = iota_tokens(32);
  const auto in_group = [&](std::uint32_t group, std::optional<std::string> kind) {
    auto s = stored({1, 2}, std::nullopt, tokens, 16);
    s.group_idx = group;
    s.kv_cache_spec_kind = std::move(kind);
    return s;
  };
  index.apply(1, in_group(0, "full_attention"));
  index.apply(1, in_group(1, "sliding_window"));
  index.apply(2, in_group(0, "mamba"));
  index.apply(2, in_group(1, "sliding_window_mla"));
  index.apply(3, in_group(0, "mla_attention"));
  index.apply(4, stored({1, 2}, std::nullopt, tokens, 16));
  for (InstanceKey k = 1; k <= 4; ++k)
    index.set_state(k, KvFeedState::exact);
  EXPECT_EQ(tokens_on(index, 1, tokens), 32u);
  EXPECT_EQ(tokens_on(index, 2, tokens), 0u);
  EXPECT_EQ(tokens_on(index, 3, tokens), 32u);
  EXPECT_EQ(tokens_on(index, 4, tokens), 32u);
  EXPECT_EQ(index.total_blocks(), 6u);
  for (const auto& row : index.instances()) {
    if (row.key == 1) {
      EXPECT_EQ(row.ignored_group, 2u);
    } else if (row.key == 2) {
      EXPECT_EQ(row.ignored_group, 4u);
    }
  }
  // The sliding-window group evicts both hashes: the full-attention blocks stay.
  index.apply(1, KvBlockRemoved{{1, 2}, "GPU", 1});
  EXPECT_EQ(tokens_on(index, 1, tokens), 32u);
  // A later event of group 1 without a kind is still sliding window; of a new group, full.
  index.apply(2, in_group(1, std::nullopt));
  EXPECT_EQ(tokens_on(index, 2, tokens), 0u);
  index.apply(2, in_group(7, std::nullopt));
  EXPECT_EQ(tokens_on(index, 2, tokens), 32u);
  // The full-attention group's own eviction does remove them.
  index.apply(1, KvBlockRemoved{{2}, "GPU", 0});
  EXPECT_EQ(tokens_on(index, 1, tokens), 16u);
}

// Blocks on the engine's GPU or its own CPU offload count as cached there; a removal from one
// medium leaves the copy on the other; blocks on other media (shared storage) are not indexed.
TEST(KvBlockIndex, MediaGpuAndCpuCountOthersDoNot) {
  KvBlockIndex index;
  const auto tokens = iota_tokens(16);
  auto gpu = stored({1}, std::nullopt, tokens, 16);
  gpu.medium = "GPU";
  auto cpu = gpu;
  cpu.medium = "CPU";
  auto disk = gpu;
  disk.medium = "STORAGE";
  index.apply(1, gpu);
  index.apply(1, cpu);
  index.apply(2, disk);
  index.set_state(1, KvFeedState::exact);
  index.set_state(2, KvFeedState::exact);
  EXPECT_EQ(tokens_on(index, 2, tokens), 0u);
  index.apply(1, KvBlockRemoved{{1}, "GPU", std::nullopt});
  EXPECT_EQ(tokens_on(index, 1, tokens), 16u);  // still offloaded to its CPU
  index.apply(1, KvBlockRemoved{{1}, "STORAGE", std::nullopt});
  EXPECT_EQ(tokens_on(index, 1, tokens), 16u);  // not a medium counted: changes nothing
  index.apply(1, KvBlockRemoved{{1}, "CPU", std::nullopt});
  EXPECT_EQ(tokens_on(index, 1, tokens), 0u);
  for (const auto& row : index.instances()) {
    if (row.key == 2) {
      EXPECT_EQ(row.ignored_medium, 1u);
    }
  }
}

// A block keyed by more than its tokens (an image, a cache_salt) matches no token-only
// request, nor do the blocks chained after it; blocks before it still do.
TEST(KvBlockIndex, ExtraKeysMakeBlocksUnmatchable) {
  KvBlockIndex index;
  const auto tokens = iota_tokens(48);
  auto s = stored({1, 2, 3}, std::nullopt, tokens, 16);
  s.extra_keys = {0, 0xabcdef, 0};
  index.apply(1, s);
  index.set_state(1, KvFeedState::exact);
  EXPECT_EQ(tokens_on(index, 1, tokens), 16u);
  EXPECT_EQ(index.total_blocks(), 3u);  // kept, so removals and children follow
}

}  // namespace
}  // namespace pdgate
