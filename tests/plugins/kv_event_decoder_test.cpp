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

// As current vLLM sends them (vllm/distributed/kv_events.py: EventBatch array_like, events
// tagged maps with omit_defaults), with a field newer than this version (locality) and an event
// type it does not know:
// msgpack.packb([1700000001.0, [
//   {"type": "BlockStored", "block_hashes": [b"\x02" * 32, b"\x03" * 32],
//    "parent_block_hash": None, "token_ids": [1, 2, 3, 4], "block_size": 2, "lora_id": 1,
//    "medium": "GPU", "lora_name": "ad1", "extra_keys": [["ad1"], ["ad1", "img-7"]],
//    "group_idx": 1, "kv_cache_spec_kind": "full_attention"},
//   {"type": "BlockStored", "block_hashes": [9], "parent_block_hash": None, "token_ids": [5, 6],
//    "block_size": 2, "lora_id": None, "medium": "CPU", "lora_name": None, "extra_keys": [None],
//    "group_idx": 2, "kv_cache_spec_kind": "sliding_window",
//    "kv_cache_spec_sliding_window": 128, "locality": "LOCAL"},
//   {"type": "BlockRemoved", "block_hashes": [9], "medium": "CPU", "group_idx": 2},
//   {"type": "BlockMigrated", "block_hashes": "not a list", "medium": 7}], 3])
constexpr std::string_view kCurrentBatch =
    "93cb41d954fc40400000948ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392c420"
    "0202020202020202020202020202020202020202020202020202020202020202c42003030303030303030303030303"
    "03030303030303030303030303030303030303b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964"
    "739401020304aa626c6f636b5f73697a6502a76c6f72615f696401a66d656469756da3475055a96c6f72615f6e616d"
    "65a3616431aa65787472615f6b6579739291a361643192a3616431a5696d672d37a967726f75705f69647801b26b76"
    "5f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e8da474797065ab426c6f636b53746f72"
    "6564ac626c6f636b5f6861736865739109b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647392"
    "0506aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0aa65"
    "787472615f6b65797391c0a967726f75705f69647802b26b765f63616368655f737065635f6b696e64ae736c696469"
    "6e675f77696e646f77bc6b765f63616368655f737065635f736c6964696e675f77696e646f77cc80a86c6f63616c69"
    "7479a54c4f43414c84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739109a66d656469"
    "756da3435055a967726f75705f6964780283a474797065ad426c6f636b4d69677261746564ac626c6f636b5f686173"
    "686573aa6e6f742061206c697374a66d656469756d0703";

// Positional events of older engines: one carrying the fields that came later (and one more
// this version does not know), a removal likewise, and one as the oldest engines sent it:
// msgpack.packb([1.5, [["BlockStored", [7], None, [1, 2], 2, None, "GPU", None, None, 0,
//   "mamba", None, "future"], ["BlockRemoved", [7], "GPU", 0, "future"],
//   ["BlockStored", [8], None, [3, 4], 2]]])
constexpr std::string_view kPositionalBatch =
    "92cb3ff8000000000000939dab426c6f636b53746f7265649107c092010202c0a3475055c0c000a56d616d6261c0"
    "a666757475726595ac426c6f636b52656d6f7665649107a347505500a666757475726595ab426c6f636b53746f72"
    "65649108c092030402";

// Current vLLM's batch: group, kind, medium, LoRA name and id are read; extra keys that only
// repeat the LoRA name count as none, an image key does not; the rank is carried; a field and
// an event type this version does not know are skipped (the unknown event's fields unread).
TEST(KvEventDecoder, CurrentVllmFieldsAreRead) {
  const auto bytes = hex(kCurrentBatch);
  auto b = decode_kv_event_batch(bytes);
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(b->data_parallel_rank, std::optional<std::int64_t>(3));
  EXPECT_EQ(b->unknown_events, 1u);
  ASSERT_EQ(b->events.size(), 3u);
  const auto& lora = std::get<KvBlockStored>(b->events[0]);
  EXPECT_EQ(lora.lora_name, std::optional<std::string>("ad1"));
  EXPECT_EQ(lora.lora_id, std::optional<std::int64_t>(1));
  EXPECT_EQ(lora.medium, std::optional<std::string>("GPU"));
  EXPECT_EQ(lora.group_idx, std::optional<std::uint32_t>(1));
  EXPECT_EQ(lora.kv_cache_spec_kind, std::optional<std::string>("full_attention"));
  ASSERT_EQ(lora.extra_keys.size(), 2u);
  EXPECT_EQ(lora.extra_keys[0], 0u);
  EXPECT_NE(lora.extra_keys[1], 0u);
  const auto& window = std::get<KvBlockStored>(b->events[1]);
  EXPECT_EQ(window.kv_cache_spec_kind, std::optional<std::string>("sliding_window"));
  EXPECT_EQ(window.medium, std::optional<std::string>("CPU"));
  EXPECT_FALSE(window.lora_name.has_value());
  EXPECT_TRUE(window.extra_keys.empty());  // [None]: keyed by its tokens alone
  const auto& removed = std::get<KvBlockRemoved>(b->events[2]);
  EXPECT_EQ(removed.block_hashes, (std::vector<EngineBlockHash>{9}));
  EXPECT_EQ(removed.medium, std::optional<std::string>("CPU"));
  EXPECT_EQ(removed.group_idx, std::optional<std::uint32_t>(2));
}

// Positional events stop after any field and may run past the last one known: the fields
// present are read, the missing ones absent, the extra ones skipped.
TEST(KvEventDecoder, PositionalEventsShortAndLong) {
  const auto bytes = hex(kPositionalBatch);
  auto b = decode_kv_event_batch(bytes);
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_FALSE(b->data_parallel_rank.has_value());
  ASSERT_EQ(b->events.size(), 3u);
  const auto& mamba = std::get<KvBlockStored>(b->events[0]);
  EXPECT_EQ(mamba.group_idx, std::optional<std::uint32_t>(0));
  EXPECT_EQ(mamba.kv_cache_spec_kind, std::optional<std::string>("mamba"));
  EXPECT_EQ(mamba.medium, std::optional<std::string>("GPU"));
  EXPECT_EQ(std::get<KvBlockRemoved>(b->events[1]).group_idx, std::optional<std::uint32_t>(0));
  const auto& oldest = std::get<KvBlockStored>(b->events[2]);
  EXPECT_EQ(oldest.block_hashes, (std::vector<EngineBlockHash>{8}));
  EXPECT_FALSE(oldest.medium.has_value());
  EXPECT_FALSE(oldest.group_idx.has_value());
  EXPECT_FALSE(oldest.kv_cache_spec_kind.has_value());
}

// A batch with one malformed new field is refused whole, with the field named: a wrong type,
// a group or rank out of range, a string past its cap, extra keys not one per block.
TEST(KvEventDecoder, MalformedNewFieldsAreRefused) {
  const auto stored_with = [](const std::vector<std::uint8_t>& key_and_value) {
    // [1, [{"type": "BlockStored", "block_hashes": [7], "token_ids": [1], "block_size": 1, K: V}]]
    std::vector<std::uint8_t> b = {0x92, 0x01, 0x91, 0x85, 0xa4, 't', 'y', 'p', 'e', 0xab};
    for (const char c : std::string_view("BlockStored"))
      b.push_back(static_cast<std::uint8_t>(c));
    b.push_back(0xac);
    for (const char c : std::string_view("block_hashes"))
      b.push_back(static_cast<std::uint8_t>(c));
    b.insert(b.end(), {0x91, 0x07, 0xa9});
    for (const char c : std::string_view("token_ids"))
      b.push_back(static_cast<std::uint8_t>(c));
    b.insert(b.end(), {0x91, 0x01, 0xaa});
    for (const char c : std::string_view("block_size"))
      b.push_back(static_cast<std::uint8_t>(c));
    b.push_back(0x01);
    b.insert(b.end(), key_and_value.begin(), key_and_value.end());
    return b;
  };
  const auto key = [](std::string_view k, std::vector<std::uint8_t> value) {
    std::vector<std::uint8_t> out = {static_cast<std::uint8_t>(0xa0 | k.size())};
    for (const char c : k)
      out.push_back(static_cast<std::uint8_t>(c));
    out.insert(out.end(), value.begin(), value.end());
    return out;
  };
  // Well formed first: the fixture itself decodes.
  ASSERT_TRUE(decode_kv_event_batch(stored_with(key("group_idx", {0x05}))).ok());
  const std::vector<std::pair<std::string, std::vector<std::uint8_t>>> bad = {
      {"group_idx", key("group_idx", {0xa1, 'x'})},
      {"group_idx", key("group_idx", {0xff})},              // -1
      {"group_idx", key("group_idx", {0xcd, 0x04, 0x00})},  // 1024
      {"medium", key("medium", {0x07})},
      {"lora_name", key("lora_name", {0x91, 0x01})},
      {"kv_cache_spec_kind", key("kv_cache_spec_kind", {0xc3})},
      {"kv_cache_spec_sliding_window", key("kv_cache_spec_sliding_window", {0xa1, 'x'})},
      {"extra_keys", key("extra_keys", {0x92, 0xc0, 0xc0})},  // two entries for one block
      {"extra_keys", key("extra_keys", {0x07})},
  };
  for (const auto& [name, kv] : bad) {
    auto b = decode_kv_event_batch(stored_with(kv));
    ASSERT_FALSE(b.ok()) << name;
    EXPECT_NE(b.error().find(name.substr(0, 10)), std::string::npos) << b.error();
  }
  std::vector<std::uint8_t> long_name = key("lora_name", {0xda, 0x04, 0x01});
  long_name.insert(long_name.end(), 1025, 'a');
  EXPECT_FALSE(decode_kv_event_batch(stored_with(long_name)).ok());
  // data_parallel_rank: negative, or past 65535.
  EXPECT_FALSE(decode_kv_event_batch(std::vector<std::uint8_t>{0x93, 0x01, 0x90, 0xff}).ok());
  EXPECT_FALSE(
      decode_kv_event_batch(std::vector<std::uint8_t>{0x93, 0x01, 0x90, 0xce, 0, 1, 0, 0}).ok());
  EXPECT_TRUE(
      decode_kv_event_batch(std::vector<std::uint8_t>{0x93, 0x01, 0x90, 0xcd, 0xff, 0xff}).ok());
}

// Every truncation of the new layouts is an error too, never a crash or a partial batch.
TEST(KvEventDecoder, TruncatedNewLayoutsAreErrors) {
  for (const auto fixture : {kCurrentBatch, kPositionalBatch}) {
    const auto bytes = hex(fixture);
    for (std::size_t n = 0; n < bytes.size(); ++n)
      EXPECT_FALSE(decode_kv_event_batch(std::span(bytes.data(), n)).ok()) << n << " bytes";
  }
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
