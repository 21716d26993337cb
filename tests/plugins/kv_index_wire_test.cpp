// The shared KV-location index's wire records and XREAD replies, without a socket.
#include <gtest/gtest.h>

#include "plugins/kv_index_wire.hpp"
#include "tests/plugins/redis_replies.hpp"

namespace pdgate::kv_wire {
namespace {

using test::array_of;
using test::string_reply;

// Records of both kinds survive an encode/decode round trip, in order, with the origin.
TEST(KvIndexWire, RoundTrip) {
  std::string body;
  append_prefix(body, 0xabcdef0123456789ull, 1'700'000'000'123, {1, 2, 0xffffffffffffffffull});
  append_conversation(body, "chat-7", 11, 22, -5);
  append_prefix(body, 3, 4, {});
  auto b = decode_batch(header(42) + body);
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(b->origin, 42u);
  ASSERT_EQ(b->prefixes.size(), 2u);
  EXPECT_EQ(b->prefixes[0].instance, 0xabcdef0123456789ull);
  EXPECT_EQ(b->prefixes[0].wall_ms, 1'700'000'000'123);
  EXPECT_EQ(b->prefixes[0].hashes, (std::vector<std::uint64_t>{1, 2, 0xffffffffffffffffull}));
  EXPECT_TRUE(b->prefixes[1].hashes.empty());
  ASSERT_EQ(b->conversations.size(), 1u);
  EXPECT_EQ(b->conversations[0].id, "chat-7");
  EXPECT_EQ(b->conversations[0].decode, 11u);
  EXPECT_EQ(b->conversations[0].prefill, 22u);
  EXPECT_EQ(b->conversations[0].wall_ms, -5);
}

// A prompt longer than kMaxBlocks blocks is shared by its first kMaxBlocks.
TEST(KvIndexWire, LongPromptCut) {
  std::string body;
  std::vector<std::uint64_t> many(kMaxBlocks + 100, 7);
  const std::size_t n = append_prefix(body, 1, 1, many);
  EXPECT_EQ(n, 21 + 8 * kMaxBlocks);
  auto b = decode_batch(header(1) + body);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->prefixes[0].hashes.size(), kMaxBlocks);
}

// Every malformed batch is refused whole: bad magic, truncation anywhere, unknown kind,
// a count past its bound or past the bytes left.
TEST(KvIndexWire, MalformedRefused) {
  std::string body;
  append_prefix(body, 1, 2, {3, 4});
  append_conversation(body, "c", 1, 2, 3);
  const std::string good = header(9) + body;
  ASSERT_TRUE(decode_batch(good).ok());
  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    // Cuts at a record boundary are whole batches; every other cut is refused.
    const bool boundary = cut == kHeaderBytes || cut == kHeaderBytes + 21 + 16;
    EXPECT_EQ(decode_batch(good.substr(0, cut)).ok(), boundary) << "cut at " << cut;
  }
  EXPECT_FALSE(decode_batch("xxxx" + good.substr(4)).ok());
  EXPECT_FALSE(decode_batch(good + "\x03").ok());
  std::string huge = header(1);
  huge += '\x01';
  huge.append(16, '\0');
  huge += std::string("\xff\xff\xff\x7f", 4);  // 2^31 hashes announced, none sent
  EXPECT_FALSE(decode_batch(huge).ok());
  std::string long_id = header(1);
  long_id += '\x02';
  long_id.append(24, '\0');
  long_id += std::string("\xff\xff", 2);  // 65535-byte id
  long_id.append(65535, 'x');
  EXPECT_FALSE(decode_batch(long_id).ok());
}

// XREAD: nil is no entries; entries keep their ids (even without the field) and payloads.
TEST(KvIndexWire, ParseXread) {
  RedisReply nil;
  nil.type = RedisReply::Type::nil;
  auto none = parse_xread(nil, "b");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  const RedisReply reply = array_of({array_of(
      {string_reply("k"),
       array_of({array_of({string_reply("1-0"), array_of({string_reply("b"), string_reply("P1")})}),
                 array_of({string_reply("2-0"), array_of({string_reply("x"), string_reply("y")})}),
                 array_of({string_reply("3-0"),
                           array_of({string_reply("b"), string_reply("P3")})})})})});
  auto e = parse_xread(reply, "b");
  ASSERT_TRUE(e.ok()) << e.error();
  ASSERT_EQ(e->size(), 3u);
  EXPECT_EQ((*e)[0].id, "1-0");
  EXPECT_EQ((*e)[0].payload, "P1");
  EXPECT_EQ((*e)[1].id, "2-0");
  EXPECT_EQ((*e)[1].payload, "");
  EXPECT_EQ((*e)[2].payload, "P3");

  RedisReply err;
  err.type = RedisReply::Type::error;
  err.text = "WRONGTYPE";
  EXPECT_FALSE(parse_xread(err, "b").ok());
  EXPECT_FALSE(parse_xread(array_of({array_of({string_reply("k")})}), "b").ok());
  EXPECT_FALSE(
      parse_xread(array_of({array_of({string_reply("k"), array_of({string_reply("1-0")})})}), "b")
          .ok());
}

}  // namespace
}  // namespace pdgate::kv_wire
