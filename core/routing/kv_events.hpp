// KV-cache events as engines publish them (vLLM's KVEventBatch; the wire
// format is read by plugins/kv_event_decoder.hpp), and the interface of
// the service that receives them from every instance configured with an
// event endpoint (docs/kv-events.md). The events feed the exact block
// index (core/routing/kv_block_index.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/base/result.hpp"
#include "core/config/config.hpp"
#include "core/routing/kv_location_index.hpp"

namespace pdgate {

// Engine block hashes are ints in older vLLMs and bytes in newer ones;
// both are reduced to 64 bits (bytes through a hash), which is all the
// index needs to follow parents and removals.
using EngineBlockHash = std::uint64_t;

// vLLM's KVCacheSpecKind values whose blocks hold every token of a prefix
// (full attention and its MLA and attention-sink variants). Other kinds
// (sliding_window, mamba, chunked_local_attention, cross_attention, ...)
// keep a window or a state, not the prefix: docs/kv-events.md.
bool is_full_attention_kind(std::string_view kind);

// Every field has a default member initializer, so aggregates naming only
// the first fields stay clear of -Wmissing-field-initializers.
struct KvBlockStored {
  std::vector<EngineBlockHash> block_hashes{};
  std::optional<EngineBlockHash> parent{};  // none: the first block of a prompt
  // block_hashes.size() * block_size ids, the blocks' tokens in order.
  std::vector<std::uint32_t> token_ids{};
  std::uint32_t block_size = 0;
  std::optional<std::int64_t> lora_id{};     // deprecated by vLLM for lora_name; older engines
  std::optional<std::string> lora_name{};    // the adapter the blocks were computed with
  std::optional<std::string> medium{};       // "GPU", "CPU", ...; none: an engine before the field
  std::optional<std::uint32_t> group_idx{};  // the KV-cache group; none: the only one
  std::optional<std::string> kv_cache_spec_kind{};  // the group's kind; none: not said
  // One per block when the engine sent extra_keys (else empty): a hash of
  // what besides the tokens and the LoRA name keyed the block (multimodal
  // inputs, cache_salt, prompt embeddings), 0 for a block keyed by its
  // tokens alone.
  std::vector<std::uint64_t> extra_keys{};
};

struct KvBlockRemoved {
  std::vector<EngineBlockHash> block_hashes{};
  std::optional<std::string> medium{};
  std::optional<std::uint32_t> group_idx{};
};

struct KvAllBlocksCleared {};

using KvEvent = std::variant<KvBlockStored, KvBlockRemoved, KvAllBlocksCleared>;

struct KvEventBatch {
  double ts = 0;  // the engine's wall clock, seconds since the epoch
  std::vector<KvEvent> events;
  // The engine's data-parallel rank (vLLM's publisher sets it on every
  // batch; each rank publishes on its own port). Checked by the decoder
  // (0 to 65535); events are applied under kv_event_source() (see
  // plugins/zmq_kv_events.hpp), the one place a rank would name an index key.
  std::optional<std::int64_t> data_parallel_rank;
  std::size_t unknown_events = 0;  // of a type this version does not know: skipped
};

// One instance whose events are to be received.
struct KvEventSubscription {
  InstanceKey key = 0;
  // "http://host:port" (with "#dp<rank>" for a data-parallel rank), for
  // metrics and logs.
  std::string instance_url;
  KvEventsEndpoint endpoint;
  // The data-parallel rank the feed is for (its endpoint is that rank's):
  // a batch naming another rank is refused, never filed under this one.
  std::optional<std::int64_t> dp_rank;
  bool operator==(const KvEventSubscription&) const = default;
};

// Receives every subscribed instance's events on threads of its own
// (never an event loop) and applies them to the block index.
class KvEventIngest {
 public:
  virtual ~KvEventIngest() = default;
  // The instances to follow from now on: new ones are subscribed, missing
  // ones dropped (and their blocks forgotten). Cheap; any thread.
  virtual void set_subscriptions(std::vector<KvEventSubscription> subs) = 0;
  virtual void stop() = 0;
};

}  // namespace pdgate
