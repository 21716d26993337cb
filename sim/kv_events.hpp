// vLLM's KV cache events, as its ZMQ publisher sends them: the
// --kv-events-config JSON, the events, and their msgpack encoding. Pure
// (no sockets): sim/kv_event_publisher.* sends what this encodes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace pdgate::sim {

// vLLM's KVEventsConfig, same keys and defaults.
struct KvEventsConfig {
  bool enabled = false;  // enable_kv_cache_events
  std::string publisher = "null";
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;  // empty: no replay socket
  std::size_t buffer_steps = 10000;
  int hwm = 100000;
  std::size_t max_queue_size = 100000;
  std::string topic;
};

struct KvEventsConfigParse {
  std::optional<KvEventsConfig> config;
  std::string error;
};

// Unknown keys and wrongly typed values are errors, as in vLLM (its config
// is a dataclass built from the JSON). publisher "zmq" is implied by
// enable_kv_cache_events when absent, as vLLM does.
KvEventsConfigParse parse_kv_events_config(std::string_view json_text);

// vLLM binds the PUB socket when the endpoint is a wildcard, ipc:// or
// inproc://, and connects it otherwise (to a subscriber that binds).
bool endpoint_binds(std::string_view endpoint);

// The endpoint data-parallel rank `rank` publishes on, as vLLM moves it:
// tcp:// gets port + rank (a `*` port stays `*`: each rank binds its own
// ephemeral port), ipc:// and inproc:// a `_dp<rank>` suffix; rank 0 and
// an empty endpoint are left as they are.
std::string offset_endpoint(std::string_view endpoint, std::size_t rank);

// How block hashes go on the wire: ints (vLLM before 0.10) or 32-byte
// values (newer vLLMs hash blocks with SHA-256).
enum class HashKind { integer, bytes };
// How batches and events go on the wire (vLLM's vllm/distributed/kv_events.py):
// - vllm: as current vLLM sends them: the batch a positional array (msgspec
//   array_like), each event a map tagged by "type" carrying every field,
//   extra_keys, group_idx and kv_cache_spec_kind included;
// - array: as vLLM did before its events became maps: batch and events
//   positional, events ending at lora_name (no group, kind or extra keys);
// - map: batch and events both maps, with every field.
enum class EventLayout { vllm, array, map };

// One KV-cache group of the simulated model: its index is its position in
// --kv-cache-groups, its kind one of vLLM's KVCacheSpecKind values.
struct CacheGroup {
  std::uint32_t idx = 0;
  std::string kind = "full_attention";
};

struct BlockStored {
  std::vector<std::uint64_t> block_hashes{};
  std::optional<std::uint64_t> parent_block_hash{};  // the block before the first one
  std::vector<std::uint32_t> token_ids{};            // every token of these blocks, in order
  std::size_t block_size = 0;                        // tokens per block
  std::string lora_name{};                           // empty: the base model's blocks
  std::int64_t lora_id = 0;                          // vLLM's int id of that adapter (1, 2, ...)
  CacheGroup group{};
};
struct BlockRemoved {
  std::vector<std::uint64_t> block_hashes{};
  std::uint32_t group_idx = 0;
};
struct AllBlocksCleared {};
using KvEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

// The 32-byte wire form of a sim block hash: the hash, then three more
// words each derived from the previous one, all big-endian. Deterministic,
// so two sims agree, and distinct hashes stay distinct (the first word).
std::string hash_bytes(std::uint64_t hash);

// msgpack(KVEventBatch): [ts, [events...], data_parallel_rank] or
// {"ts", "events", "data_parallel_rank"}; each event tagged by its type
// ("BlockStored", "BlockRemoved", "AllBlocksCleared") with medium "GPU",
// in `layout`.
std::string encode_batch(double ts, const std::vector<KvEvent>& events, int data_parallel_rank,
                         EventLayout layout, HashKind hashes);

}  // namespace pdgate::sim
