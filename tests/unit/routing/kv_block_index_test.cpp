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

// LoRA adapters' blocks are different KV: a request without the adapter does not match them.
TEST(KvBlockIndex, LoraBlocksAreApart) {
  KvBlockIndex index;
  const auto tokens = iota_tokens(16);
  auto s = stored({1}, std::nullopt, tokens, 16);
  s.lora_id = 3;
  index.apply(1, s);
  index.set_state(1, KvFeedState::exact);
  EXPECT_EQ(tokens_on(index, 1, tokens), 0u);
  EXPECT_EQ(index.cached_tokens(tokens, 3)[0].tokens, 16u);
}

}  // namespace
}  // namespace pdgate
