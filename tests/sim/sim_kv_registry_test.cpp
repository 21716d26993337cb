#include <gtest/gtest.h>

#include "sim/kv_registry.hpp"

namespace pdgate::sim {
namespace {

using namespace std::chrono_literals;
using Clock = KvRegistry::Clock;

// Issued params are valid for the first pull and reused for every later one.
TEST(SimKvRegistry, ConsumeOnceThenReused) {
  KvRegistry r("eng", 480s);
  const auto t = Clock::now();
  r.issue("cmpl-a-0-1", {1, 2, 3}, t);
  EXPECT_EQ(r.outstanding(t), 1u);
  EXPECT_EQ(r.outstanding_blocks(t), 3u);
  EXPECT_EQ(r.consume("eng", "cmpl-a-0-1", {1, 2, 3}, t), KvResult::valid);
  EXPECT_EQ(r.outstanding(t), 0u);
  EXPECT_EQ(r.outstanding_blocks(t), 0u);
  EXPECT_EQ(r.consume("eng", "cmpl-a-0-1", {1, 2, 3}, t), KvResult::reused);
}

// Never-issued ids, another engine's id or altered block ids are unknown.
TEST(SimKvRegistry, UnknownCases) {
  KvRegistry r("eng", 480s);
  const auto t = Clock::now();
  r.issue("x", {1}, t);
  EXPECT_EQ(r.consume("eng", "nope", {1}, t), KvResult::unknown);
  EXPECT_EQ(r.consume("other", "x", {1}, t), KvResult::unknown);
  EXPECT_EQ(r.consume("eng", "x", {2}, t), KvResult::unknown);
  EXPECT_EQ(r.outstanding(t), 1u);  // failed pulls do not consume
  EXPECT_EQ(r.consume("eng", "x", {1}, t), KvResult::valid);
}

// After the TTL the params are gone: a late pull is unknown and frees nothing twice.
TEST(SimKvRegistry, ExpiresAfterTtl) {
  KvRegistry r("eng", 480s);
  const auto t = Clock::now();
  r.issue("x", {1, 2}, t);
  r.issue("y", {3}, t + 100s);
  EXPECT_EQ(r.outstanding(t + 479s), 2u);
  EXPECT_EQ(r.outstanding(t + 480s), 1u);
  EXPECT_EQ(r.outstanding_blocks(t + 480s), 1u);
  EXPECT_EQ(r.consume("eng", "x", {1, 2}, t + 481s), KvResult::unknown);
  EXPECT_EQ(r.consume("eng", "y", {3}, t + 481s), KvResult::valid);
}

// The map is bounded: the oldest entries are dropped first.
TEST(SimKvRegistry, BoundedSize) {
  KvRegistry r("eng", 480s, 3);
  const auto t = Clock::now();
  for (int i = 0; i < 5; ++i)
    r.issue("id" + std::to_string(i), {i}, t);
  EXPECT_EQ(r.size(t), 3u);
  EXPECT_EQ(r.outstanding(t), 3u);
  EXPECT_EQ(r.consume("eng", "id0", {0}, t), KvResult::unknown);
  EXPECT_EQ(r.consume("eng", "id4", {4}, t), KvResult::valid);
}

// Block ids arrive nested (newer engines) or flat (older ones); both flatten.
TEST(SimKvRegistry, FlattenBlockIds) {
  using nlohmann::json;
  EXPECT_EQ(flatten_block_ids(json::parse("[[1,2],[3]]")), (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(flatten_block_ids(json::parse("[4,5]")), (std::vector<std::int64_t>{4, 5}));
  EXPECT_FALSE(flatten_block_ids(json(nullptr)));
  EXPECT_FALSE(flatten_block_ids(json::parse("[\"a\"]")));
}

}  // namespace
}  // namespace pdgate::sim
