// Decodes one vLLM KV-event batch (the third frame of a ZMQ message) from
// MessagePack into events. Pure: bytes in, events or an error out. Every
// layout vLLM has used is read (checked against vLLM's
// vllm/distributed/kv_events.py): the batch a positional array [ts,
// [events...], data_parallel_rank?] or a map {"ts", "events",
// "data_parallel_rank"}; each event a positional array ["BlockStored", ...]
// (msgspec array_like, vLLM before its events became maps) or a map tagged
// by "type" (current vLLM). Positional events may stop after any field
// (older engines, msgspec's omit_defaults) and may carry fields after the
// last one known here (newer engines): those are skipped. Every count and
// string is capped, every known field's type checked, so a hostile
// publisher cannot make the gateway hold more than a bounded multiple of
// what it sent; a batch with one malformed event is refused whole (the
// feed then falls back: a removal skipped alone would leave a block the
// engine no longer has).
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
  std::size_t max_string = 1024;          // bytes of a lora_name, medium or kind
  std::uint32_t max_group_idx = 1023;     // KV-cache groups per engine
  std::int64_t max_dp_rank = 65'535;      // data_parallel_rank
};

Result<KvEventBatch> decode_kv_event_batch(std::span<const std::uint8_t> payload,
                                           const KvDecodeLimits& limits = {});

// A bytes block hash reduced to the 64 bits the index keys by.
EngineBlockHash fold_block_hash(std::span<const std::uint8_t> bytes);

}  // namespace pdgate
