// vLLM's KV-event batches decoded from MessagePack, without a socket. The
// well-formed fixtures were encoded by Python's msgpack (python3-msgpack),
// as vLLM's publisher encodes them, not by this project's code.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plugins/kv_event_decoder.hpp"
#include "plugins/msgpack_reader.hpp"

namespace pdgate {
namespace {

std::vector<std::uint8_t> hex(std::string_view h) {
  std::vector<std::uint8_t> out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<std::uint8_t>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  return out;
}

// msgpack.packb([1700000000.5, [["BlockStored", [123, -5], None, [1, 2, 3, 4], 2, None, "GPU",
// None], ["BlockRemoved", [123], "GPU"], ["AllBlocksCleared"]], 0])
constexpr std::string_view kArrayBatch =
    "93cb41d954fc402000009398ab426c6f636b53746f726564927bfbc0940102030402c0a3475055c093ac426c6f"
    "636b52656d6f766564917ba347505591b0416c6c426c6f636b73436c656172656400";

// msgpack.packb({"ts": 1.25, "events": [{"type": "BlockStored", "block_hashes": [b"\x01" * 32],
// "parent_block_hash": None, "token_ids": [300, 70000], "block_size": 2, "lora_id": None}],
// "data_parallel_rank": None})
constexpr std::string_view kMapBatch =
    "83a27473cb3ff4000000000000a66576656e74739186a474797065ab426c6f636b53746f726564ac626c6f636b"
    "5f68617368657391c4200101010101010101010101010101010101010101010101010101010101010101b170617265"
    "6e745f626c6f636b5f68617368c0a9746f6b656e5f69647392cd012cce00011170aa626c6f636b5f73697a6502a7"
    "6c6f72615f6964c0b2646174615f706172616c6c656c5f72616e6bc0";

// The positional layout with int hashes (one negative) gives all three event kinds, in order.
TEST(KvEventDecoder, ArrayBatchWithIntHashes) {
  const auto bytes = hex(kArrayBatch);
  auto b = decode_kv_event_batch(bytes);
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_DOUBLE_EQ(b->ts, 1700000000.5);
  ASSERT_EQ(b->data_parallel_rank, std::optional<std::int64_t>(0));
  ASSERT_EQ(b->events.size(), 3u);
  const auto& s = std::get<KvBlockStored>(b->events[0]);
  EXPECT_EQ(s.block_hashes, (std::vector<EngineBlockHash>{123, static_cast<EngineBlockHash>(-5)}));
  EXPECT_FALSE(s.parent.has_value());
  EXPECT_EQ(s.token_ids, (std::vector<std::uint32_t>{1, 2, 3, 4}));
  EXPECT_EQ(s.block_size, 2u);
  EXPECT_EQ(std::get<KvBlockRemoved>(b->events[1]).block_hashes,
            (std::vector<EngineBlockHash>{123}));
  EXPECT_TRUE(std::holds_alternative<KvAllBlocksCleared>(b->events[2]));
}

// The map layout with a 32-byte bytes hash and large token ids decodes the same way.
TEST(KvEventDecoder, MapBatchWithBytesHashes) {
  const auto bytes = hex(kMapBatch);
  auto b = decode_kv_event_batch(bytes);
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_DOUBLE_EQ(b->ts, 1.25);
  EXPECT_FALSE(b->data_parallel_rank.has_value());
  ASSERT_EQ(b->events.size(), 1u);
  const auto& s = std::get<KvBlockStored>(b->events[0]);
  const std::vector<std::uint8_t> h(32, 1);
  EXPECT_EQ(s.block_hashes, (std::vector<EngineBlockHash>{fold_block_hash(h)}));
  EXPECT_EQ(s.token_ids, (std::vector<std::uint32_t>{300, 70000}));
}

// Every truncation of a valid batch is an error, never a crash or a partial batch.
TEST(KvEventDecoder, TruncatedBatchesAreErrors) {
  for (const auto fixture : {kArrayBatch, kMapBatch}) {
    const auto bytes = hex(fixture);
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      auto b = decode_kv_event_batch(std::span(bytes.data(), n));
      EXPECT_FALSE(b.ok()) << "prefix of " << n << " bytes decoded";
    }
  }
}

// A header claiming 4 billion elements in a few bytes is refused before anything is sized by it.
TEST(KvEventDecoder, HugeDeclaredLengthsAreRefused) {
  const std::vector<std::uint8_t> array32 = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02};
  MsgpackReader r(array32);
  EXPECT_FALSE(r.read_array().ok());
  const std::vector<std::uint8_t> str32 = {0xdb, 0x7f, 0xff, 0xff, 0xff, 'a'};
  MsgpackReader s(str32);
  EXPECT_FALSE(s.read_str().ok());
  // [ts, <array32 of 2^32-1 events>]
  const std::vector<std::uint8_t> batch = {0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90};
  auto b = decode_kv_event_batch(batch);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().find("array"), std::string::npos) << b.error();
}

// A million nested arrays are skipped without recursion (an unknown batch field).
TEST(KvEventDecoder, DeepNestingIsSkippedIteratively) {
  std::vector<std::uint8_t> bytes = {0x93, 0x01, 0x90};  // [1, [], <deep>]
  bytes.insert(bytes.end(), 1'000'000, 0x91);
  bytes.push_back(0xc0);
  // The third item is data_parallel_rank: an array there is an error, not a crash.
  EXPECT_FALSE(decode_kv_event_batch(bytes).ok());
  MsgpackReader r(std::span<const std::uint8_t>(bytes).subspan(3));
  ASSERT_TRUE(r.skip().ok());
  EXPECT_TRUE(r.at_end());
}

// Caps: more events, hashes or bytes than allowed are errors naming the cap.
TEST(KvEventDecoder, LimitsAreEnforced) {
  const auto bytes = hex(kArrayBatch);
  KvDecodeLimits few;
  few.max_events = 2;
  EXPECT_FALSE(decode_kv_event_batch(bytes, few).ok());
  KvDecodeLimits small;
  small.max_bytes = bytes.size() - 1;
  EXPECT_FALSE(decode_kv_event_batch(bytes, small).ok());
  KvDecodeLimits hashes;
  hashes.max_hashes = 1;
  EXPECT_FALSE(decode_kv_event_batch(bytes, hashes).ok());
}

// Token ids that do not fill the blocks exactly, or a bad block size, are refused.
TEST(KvEventDecoder, InconsistentBlockStoredIsRefused) {
  // [1, [["BlockStored", [7], nil, [1, 2, 3], 2]]]
  const std::vector<std::uint8_t> odd = {0x92, 0x01, 0x91, 0x95, 0xab, 'B',  'l',  'o',
                                         'c',  'k',  'S',  't',  'o',  'r',  'e',  'd',
                                         0x91, 0x07, 0xc0, 0x93, 0x01, 0x02, 0x03, 0x02};
  auto b = decode_kv_event_batch(odd);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().find("token ids"), std::string::npos) << b.error();
  auto zero = odd;
  zero.back() = 0x00;  // block_size 0
  EXPECT_FALSE(decode_kv_event_batch(zero).ok());
}

// An event type this version does not know is skipped and counted, the rest kept.
TEST(KvEventDecoder, UnknownEventTypesAreSkipped) {
  // [1, [["Future", 1, [2]], ["AllBlocksCleared"]]]
  const std::vector<std::uint8_t> bytes = {
      0x92, 0x01, 0x92, 0x93, 0xa6, 'F', 'u', 't', 'u', 'r', 'e', 0x01, 0x91, 0x02, 0x91, 0xb0,
      'A',  'l',  'l',  'B',  'l',  'o', 'c', 'k', 's', 'C', 'l', 'e',  'a',  'r',  'e',  'd'};
  auto b = decode_kv_event_batch(bytes);
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(b->unknown_events, 1u);
  ASSERT_EQ(b->events.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<KvAllBlocksCleared>(b->events[0]));
}

// Integers of every width read back with their sign; floats of both widths too.
TEST(MsgpackReader, IntegersAndFloats) {
  const std::vector<std::uint8_t> bytes = {
      0x7f, 0xe0, 0xcc, 0xff, 0xd0, 0x80, 0xcd, 0x01, 0x00, 0xd1, 0xff, 0x00, 0xce,
      0xff, 0xff, 0xff, 0xff, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe,
      0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xca, 0x3f, 0xc0, 0x00,
      0x00, 0xcb, 0x3f, 0xf4, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  MsgpackReader r(bytes);
  EXPECT_EQ(*r.read_int(), 127);
  EXPECT_EQ(*r.read_int(), -32);
  EXPECT_EQ(*r.read_int(), 255);
  EXPECT_EQ(*r.read_int(), -128);
  EXPECT_EQ(*r.read_int(), 256);
  EXPECT_EQ(*r.read_int(), -256);
  EXPECT_EQ(*r.read_int(), 4294967295);
  EXPECT_EQ(*r.read_int(), -2);
  EXPECT_EQ(static_cast<std::uint64_t>(*r.read_int()), 0xffffffffffffffffull);
  EXPECT_FLOAT_EQ(static_cast<float>(*r.read_float()), 1.5f);
  EXPECT_DOUBLE_EQ(*r.read_float(), 1.25);
  EXPECT_TRUE(r.at_end());
  const std::vector<std::uint8_t> bad = {0xc1};
  EXPECT_FALSE(MsgpackReader(bad).peek().ok());
}

}  // namespace
}  // namespace pdgate
