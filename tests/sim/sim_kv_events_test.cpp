#include <gtest/gtest.h>

#include <string>

#include "sim/kv_events.hpp"
#include "tests/sim/hex.hpp"

namespace pdgate::sim {
namespace {

using test::hex;

// The expected bytes below are python3-msgpack's msgpack.packb() of the same
// batch written as vLLM's msgspec structures encode it.

// Array layout: [ts, [["BlockStored", ...8 fields], ["BlockRemoved", ...], ["AllBlocksCleared"]],
// rank].
TEST(SimKvEvents, ArrayLayoutMatchesVllmsPositionalEncoding) {
  std::vector<KvEvent> events = {
      BlockStored{{1, 18446744073709551615ull}, std::nullopt, {10, 11, 12, 4294967295u}, 2},
      BlockRemoved{{3}}, AllBlocksCleared{}};
  EXPECT_EQ(hex(encode_batch(1.5, events, 0, EventLayout::array, HashKind::integer)),
            "93cb3ff80000000000009398ab426c6f636b53746f7265649201cfffffffffffffffffc0940a0b0cceff"
            "ffffff02c0a3475055c093ac426c6f636b52656d6f7665649103a347505591b0416c6c426c6f636b7343"
            "6c656172656400");
}

// Map layout: {"ts", "events": [{"type": ..., field: value...}], "data_parallel_rank"}, each
// event with the fields current vLLM adds (extra_keys, group_idx, kv_cache_spec_kind).
TEST(SimKvEvents, MapLayoutMatchesVllmsKeyedEncoding) {
  std::vector<KvEvent> events = {BlockStored{{1, 2}, 7, {10}, 1}, BlockRemoved{{3}},
                                 AllBlocksCleared{}};
  EXPECT_EQ(hex(encode_batch(1.5, events, 0, EventLayout::map, HashKind::integer)),
            "83a27473cb3ff8000000000000a66576656e7473938ba474797065ab426c6f636b53746f726564ac626c"
            "6f636b5f686173686573920102b1706172656e745f626c6f636b5f6861736807a9746f6b656e5f696473"
            "910aaa626c6f636b5f73697a6501a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e61"
            "6d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f73706563"
            "5f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c"
            "6f636b5f6861736865739103a66d656469756da3475055a967726f75705f6964780081a474797065b041"
            "6c6c426c6f636b73436c6561726564b2646174615f706172616c6c656c5f72616e6b00");
}

// Current vLLM's layout: a positional batch of event maps; a LoRA adapter's block names it
// (lora_id, lora_name, extra_keys) and a sliding-window group's carries its window.
TEST(SimKvEvents, VllmLayoutMatchesCurrentVllmsEncoding) {
  BlockStored lora{{5}, std::nullopt, {1, 2}, 2};
  lora.lora_name = "ad1";
  lora.lora_id = 1;
  lora.group = {1, "sliding_window"};
  std::vector<KvEvent> events = {lora, BlockRemoved{{3}, 1}};
  EXPECT_EQ(hex(encode_batch(1.5, events, 0, EventLayout::vllm, HashKind::integer)),
            "93cb3ff8000000000000928ca474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
            "9105b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c6f636b5f73"
            "697a6502a76c6f72615f696401a66d656469756da3475055a96c6f72615f6e616d65a3616431aa657874"
            "72615f6b6579739191a3616431a967726f75705f69647801b26b765f63616368655f737065635f6b696e"
            "64ae736c6964696e675f77696e646f77bc6b765f63616368655f737065635f736c6964696e675f77696e"
            "646f770884a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739103a66d6564"
            "69756da3475055a967726f75705f6964780100");
}

// Byte hashes are 32-byte bin values starting with the hash itself, big-endian.
TEST(SimKvEvents, ByteHashesAreThirtyTwoByteBins) {
  EXPECT_EQ(hex(hash_bytes(5)), "0000000000000005a8c7f332281a31464f27dda5669a55a00943d1a9966459bc");
  EXPECT_NE(hash_bytes(5), hash_bytes(6));
  EXPECT_EQ(hex(encode_batch(0.0, {BlockRemoved{{5}}}, 0, EventLayout::array, HashKind::bytes)),
            "93cb00000000000000009193ac426c6f636b52656d6f76656491c4200000000000000005a8c7f33228"
            "1a31464f27dda5669a55a00943d1a9966459bca347505500");
}

// vLLM's keys and defaults; enabling events implies the zmq publisher.
TEST(SimKvEvents, ConfigKeysAndDefaults) {
  auto p = parse_kv_events_config(
      R"({"enable_kv_cache_events": true, "endpoint": "tcp://*:5557",
          "replay_endpoint": "tcp://*:5558", "buffer_steps": 50, "hwm": 10,
          "max_queue_size": 20, "topic": "kv"})");
  ASSERT_TRUE(p.config) << p.error;
  EXPECT_TRUE(p.config->enabled);
  EXPECT_EQ(p.config->publisher, "zmq");
  EXPECT_EQ(p.config->replay_endpoint, "tcp://*:5558");
  EXPECT_EQ(p.config->buffer_steps, 50u);
  EXPECT_EQ(p.config->hwm, 10);
  EXPECT_EQ(p.config->max_queue_size, 20u);
  EXPECT_EQ(p.config->topic, "kv");
  auto d = parse_kv_events_config(R"({"enable_kv_cache_events": true})");
  ASSERT_TRUE(d.config) << d.error;
  EXPECT_EQ(d.config->endpoint, "tcp://*:5557");
  EXPECT_TRUE(d.config->replay_endpoint.empty());
  EXPECT_EQ(d.config->buffer_steps, 10000u);
  EXPECT_EQ(d.config->topic, "");
  auto off = parse_kv_events_config(R"({"replay_endpoint": null})");
  ASSERT_TRUE(off.config) << off.error;
  EXPECT_FALSE(off.config->enabled);
  EXPECT_EQ(off.config->publisher, "null");
}

// Unknown keys, wrong types, bad publishers and non-objects are errors naming the problem.
TEST(SimKvEvents, ConfigErrors) {
  EXPECT_NE(parse_kv_events_config(R"({"enable_kv_events": true})").error.find("unknown key"),
            std::string::npos);
  EXPECT_NE(parse_kv_events_config(R"({"enable_kv_cache_events": 1})").error.find("boolean"),
            std::string::npos);
  EXPECT_NE(parse_kv_events_config(R"({"publisher": "kafka"})").error.find("publisher"),
            std::string::npos);
  EXPECT_NE(parse_kv_events_config(R"({"buffer_steps": 0})").error.find("buffer_steps"),
            std::string::npos);
  EXPECT_NE(parse_kv_events_config(R"({"hwm": -1})").error.find("hwm"), std::string::npos);
  EXPECT_NE(parse_kv_events_config(R"({"topic": 3})").error.find("topic"), std::string::npos);
  EXPECT_FALSE(parse_kv_events_config("[1]").error.empty());
  EXPECT_FALSE(parse_kv_events_config("{").error.empty());
}

// Wildcards, ipc:// and inproc:// bind (vLLM's rule); a concrete address connects.
// As vLLM's ZmqEventPublisher.offset_endpoint_port moves a rank's endpoint.
TEST(SimKvEvents, DataParallelRanksMoveTheEndpoint) {
  EXPECT_EQ(offset_endpoint("tcp://*:5557", 0), "tcp://*:5557");
  EXPECT_EQ(offset_endpoint("tcp://*:5557", 3), "tcp://*:5560");
  EXPECT_EQ(offset_endpoint("tcp://[::1]:5557", 1), "tcp://[::1]:5558");
  EXPECT_EQ(offset_endpoint("tcp://127.0.0.1:*", 2), "tcp://127.0.0.1:*");
  EXPECT_EQ(offset_endpoint("ipc:///tmp/kv", 2), "ipc:///tmp/kv_dp2");
  EXPECT_EQ(offset_endpoint("inproc://cache", 1), "inproc://cache_dp1");
  EXPECT_EQ(offset_endpoint("", 1), "");
}

TEST(SimKvEvents, WhichEndpointsBind) {
  EXPECT_TRUE(endpoint_binds("tcp://*:5557"));
  EXPECT_TRUE(endpoint_binds("tcp://127.0.0.1:*"));
  EXPECT_TRUE(endpoint_binds("ipc:///tmp/kv"));
  EXPECT_TRUE(endpoint_binds("inproc://kv"));
  EXPECT_FALSE(endpoint_binds("tcp://127.0.0.1:5557"));
}

}  // namespace
}  // namespace pdgate::sim
