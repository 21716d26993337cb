// The records replicas exchange to share their KV-location index
// (plugins/redis_kv_index.hpp), and the Redis stream replies that carry
// them: pure functions, unit-tested and fuzzed without a socket.
//
// A batch is one stream entry's payload, little-endian binary:
//   "pdk1" | origin:u64 | record*
//   record := 1 | instance:u64 | wall_ms:i64 | n:u32 | hash:u64 * n      (a prefix routed)
//           | 2 | decode:u64 | prefill:u64 | wall_ms:i64 | len:u16 | id  (a conversation's turn)
// Times are the system clock (replicas' steady clocks are unrelated).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/result.hpp"
#include "core/routing/kv_location_index.hpp"
#include "plugins/redis_protocol.hpp"

namespace pdgate::kv_wire {

// Longer prompts are shared by their first kMaxBlocks blocks (1 MiB of
// prompt at the default 256-byte blocks): a match on those is what
// decides a route, and it keeps one record under 33 KB.
inline constexpr std::size_t kMaxBlocks = 4096;
inline constexpr std::size_t kMaxConversationId = 1024;
inline constexpr std::size_t kHeaderBytes = 12;

struct PrefixRecord {
  InstanceKey instance = 0;
  std::int64_t wall_ms = 0;
  std::vector<std::uint64_t> hashes;
};

struct ConversationRecord {
  std::string id;
  InstanceKey decode = 0;
  InstanceKey prefill = 0;
  std::int64_t wall_ms = 0;
};

struct Batch {
  std::uint64_t origin = 0;  // the publishing replica, to skip its own
  std::vector<PrefixRecord> prefixes;
  std::vector<ConversationRecord> conversations;
};

// Append one record to `out` (a batch body, without its header); return
// the bytes appended. Hashes past kMaxBlocks and id bytes past
// kMaxConversationId are left out.
std::size_t append_prefix(std::string& out, InstanceKey instance, std::int64_t wall_ms,
                          const std::vector<std::uint64_t>& hashes);
std::size_t append_conversation(std::string& out, std::string_view id, InstanceKey decode,
                                InstanceKey prefill, std::int64_t wall_ms);

// The header a batch body is sent with.
std::string header(std::uint64_t origin);

// Parses a whole batch; any malformed byte (bad magic, truncated record,
// unknown kind, a count past its bound, trailing bytes) fails it whole.
Result<Batch> decode_batch(std::string_view bytes);

// One entry of an XREAD reply: its stream id and the value of its field
// `field` (empty when it has none).
struct StreamEntry {
  std::string id;
  std::string payload;
};
// XREAD's reply: nil (BLOCK timed out) is no entries; anything malformed
// is an error.
Result<std::vector<StreamEntry>> parse_xread(const RedisReply& reply, std::string_view field);

}  // namespace pdgate::kv_wire
