#include <gtest/gtest.h>

#include "sim/latency.hpp"
#include "sim/prefix_cache.hpp"

namespace pdgate::sim {
namespace {

// block_size 2 tokens = 8 bytes per block.
std::string blocks(const std::string& letters) {
  std::string s;
  for (char c : letters)
    s += std::string(8, c);
  return s;
}

// Only full blocks are hashed; a partial tail has no hash.
TEST(SimPrefixCache, HashesFullBlocksOnly) {
  PrefixCache c(2, 100);
  EXPECT_EQ(c.block_hashes(blocks("ab")).size(), 2u);
  EXPECT_EQ(c.block_hashes(blocks("ab") + "xyz").size(), 2u);
  EXPECT_EQ(c.block_hashes("1234567").size(), 0u);
}

// Hashes are chained: the same block after a different prefix hashes differently.
TEST(SimPrefixCache, HashesAreChained) {
  PrefixCache c(2, 100);
  auto ab = c.block_hashes(blocks("ab"));
  auto cb = c.block_hashes(blocks("cb"));
  EXPECT_NE(ab[1], cb[1]);
  EXPECT_EQ(ab, c.block_hashes(blocks("ab")));
}

// A lookup matches the longest run of leading cached blocks and stops at the first miss.
TEST(SimPrefixCache, MatchesLongestLeadingRun) {
  PrefixCache c(2, 100);
  c.insert(c.block_hashes(blocks("abc")));
  EXPECT_EQ(c.match(c.block_hashes(blocks("abcd"))), 3u);
  EXPECT_EQ(c.match(c.block_hashes(blocks("abxd"))), 2u);
  EXPECT_EQ(c.match(c.block_hashes(blocks("xbc"))), 0u);
}

// Inserting the same chain twice returns the same ids and adds no blocks.
TEST(SimPrefixCache, InsertIsIdempotent) {
  PrefixCache c(2, 100);
  auto ids1 = c.insert(c.block_hashes(blocks("abc")));
  auto ids2 = c.insert(c.block_hashes(blocks("abc")));
  EXPECT_EQ(ids1, ids2);
  EXPECT_EQ(c.size(), 3u);
  EXPECT_LT(ids1[0], ids1[1]);  // ids ascend along the chain
  EXPECT_LT(ids1[1], ids1[2]);
  const auto fresh = c.fresh_block_id();
  for (auto id : ids1)
    EXPECT_NE(id, fresh);
}

// Over capacity the least recently used blocks go, chain tails before heads.
TEST(SimPrefixCache, LruEvictsOldestAndTailsFirst) {
  PrefixCache c(2, 4);
  c.insert(c.block_hashes(blocks("abc")));  // 3 blocks
  c.insert(c.block_hashes(blocks("xy")));   // 5 > 4: one block of "abc" goes
  EXPECT_EQ(c.size(), 4u);
  // The evicted block is abc's tail, so "ab" still hits fully.
  EXPECT_EQ(c.match(c.block_hashes(blocks("abc"))), 2u);
  // Touching "ab" made it recent; a new chain now evicts from "xy" first.
  c.insert(c.block_hashes(blocks("pq")));
  EXPECT_EQ(c.match(c.block_hashes(blocks("ab"))), 2u);
  EXPECT_EQ(c.match(c.block_hashes(blocks("pq"))), 2u);
  EXPECT_EQ(c.match(c.block_hashes(blocks("xy"))), 0u);
}

// A disabled cache never hits and stores nothing, but still hands out ids.
TEST(SimPrefixCache, DisabledNeverHits) {
  PrefixCache c(2, 100, false);
  auto ids = c.insert(c.block_hashes(blocks("ab")));
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(c.match(c.block_hashes(blocks("ab"))), 0u);
  EXPECT_EQ(c.size(), 0u);
}

// An insert reports the chain positions it newly cached; already cached ones are not reported.
TEST(SimPrefixCache, InsertReportsNewlyStoredPositions) {
  PrefixCache c(2, 100);
  CacheChanges first;
  c.insert(c.block_hashes(blocks("ab")), &first);
  EXPECT_EQ(first.stored, (std::vector<std::size_t>{0, 1}));
  EXPECT_TRUE(first.removed.empty());
  CacheChanges second;
  c.insert(c.block_hashes(blocks("abcd")), &second);
  EXPECT_EQ(second.stored, (std::vector<std::size_t>{2, 3}));
  CacheChanges again;
  c.insert(c.block_hashes(blocks("abcd")), &again);
  EXPECT_TRUE(again.empty());
}

// Evicting another chain's blocks reports their hashes, tail first, and only those.
TEST(SimPrefixCache, InsertReportsEvictedBlocks) {
  PrefixCache c(2, 4);
  const auto abc = c.block_hashes(blocks("abc"));
  c.insert(abc);
  CacheChanges ch;
  c.insert(c.block_hashes(blocks("xy")), &ch);
  EXPECT_EQ(ch.stored, (std::vector<std::size_t>{0, 1}));
  ASSERT_EQ(ch.removed.size(), 1u);
  EXPECT_EQ(ch.removed[0], abc[2]);
  EXPECT_FALSE(c.contains(abc[2]));
}

// A chain longer than the cache: blocks it adds and evicts again are in neither list,
// and what it reports matches what the cache then holds.
TEST(SimPrefixCache, ChainLongerThanTheCacheReportsOnlyNetChanges) {
  PrefixCache c(2, 2);
  const auto old = c.block_hashes(blocks("q"));
  c.insert(old);
  const auto chain = c.block_hashes(blocks("abcd"));
  CacheChanges ch;
  c.insert(chain, &ch);
  EXPECT_EQ(ch.stored, (std::vector<std::size_t>{0, 1}));  // the head survives
  EXPECT_EQ(ch.removed, old);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_TRUE(c.contains(chain[0]));
  EXPECT_TRUE(c.contains(chain[1]));
}

// A cached block evicted and re-added within one insert is no change at all.
TEST(SimPrefixCache, EvictedAndReaddedBlockIsNotReported) {
  PrefixCache c(2, 2);
  const auto ab = c.block_hashes(blocks("ab"));
  c.insert(ab);
  const auto abc = c.block_hashes(blocks("abc"));
  CacheChanges ch;
  // Inserting tail-first: c enters and evicts b, b re-enters and evicts a, a re-enters and
  // evicts c: a and b are cached before and after, c never stayed.
  c.insert(abc, &ch);
  EXPECT_TRUE(ch.empty()) << ch.stored.size() << " stored, " << ch.removed.size() << " removed";
  EXPECT_TRUE(c.contains(ab[0]));
  EXPECT_TRUE(c.contains(ab[1]));
}

// clear() drops every block.
TEST(SimPrefixCache, ClearDropsEverything) {
  PrefixCache c(2, 100);
  c.insert(c.block_hashes(blocks("abc")));
  c.clear();
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(c.match(c.block_hashes(blocks("abc"))), 0u);
}

// At least the last prompt token is computed: a full hit is capped.
TEST(SimPrefixCache, CachedTokensLeaveOneToCompute) {
  EXPECT_EQ(cached_prefix_tokens(3, 16, 100), 48u);
  EXPECT_EQ(cached_prefix_tokens(2, 16, 32), 16u);  // full hit of 32 tokens
  EXPECT_EQ(cached_prefix_tokens(2, 16, 33), 32u);
  EXPECT_EQ(cached_prefix_tokens(5, 16, 0), 0u);
}

// Prefill = base + uncached tokens x per-token cost; decode = itl per token.
TEST(SimLatencyModel, Formulas) {
  LatencyModel m{2.0, 50.0, 10.0, 1.0};
  EXPECT_EQ(m.prefill(0).count(), 2000);
  EXPECT_EQ(m.prefill(1000).count(), 52000);
  EXPECT_EQ(m.itl().count(), 10000);
  EXPECT_EQ(m.pull().count(), 1000);
}

}  // namespace
}  // namespace pdgate::sim
