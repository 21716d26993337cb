// Decodes one vLLM KV-event batch (the third frame of a ZMQ message) from
// MessagePack into events. Pure: bytes in, events or an error out. Both
// layouts vLLM has used are read: a positional array [ts, [events...],
// data_parallel_rank?] with events as tagged arrays ["BlockStored", ...],
// and a map {"ts", "events", "data_parallel_rank"} with events as maps
// tagged by "type". Every count is capped, so a hostile publisher cannot
// make the gateway hold more than a bounded multiple of what it sent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/base/result.hpp"
#include "core/routing/kv_events.hpp"

namespace pdgate {

struct KvDecodeLimits {
  std::size_t max_bytes = 16u << 20;      // a whole payload
  std::size_t max_events = 65'536;        // per batch
  std::size_t max_hashes = 65'536;        // per event
  std::size_t max_token_ids = 1u << 20;   // per event
  std::size_t max_block_size = 1u << 16;  // tokens per block
};

Result<KvEventBatch> decode_kv_event_batch(std::span<const std::uint8_t> payload,
                                           const KvDecodeLimits& limits = {});

// A bytes block hash reduced to the 64 bits the index keys by.
EngineBlockHash fold_block_hash(std::span<const std::uint8_t> bytes);

}  // namespace pdgate
