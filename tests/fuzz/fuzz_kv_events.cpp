// vLLM KV-event batches (plugins/kv_event_decoder.cpp over
// plugins/msgpack_reader.cpp) come from any process that can reach the
// gateway's subscription. Any bytes must decode or be refused without a
// crash, an over-read or an allocation larger than the input justifies;
// what decodes is applied to a small exact index whose caps must hold.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "core/routing/kv_block_index.hpp"
#include "plugins/kv_event_decoder.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pdgate;
  auto b = decode_kv_event_batch(std::span(data, size));
  if (!b)
    return 0;
  // Every decoded element took at least one input byte.
  std::size_t elements = b->events.size();
  for (const auto& e : b->events) {
    if (const auto* s = std::get_if<KvBlockStored>(&e))
      elements += s->block_hashes.size() + s->token_ids.size();
    else if (const auto* r = std::get_if<KvBlockRemoved>(&e))
      elements += r->block_hashes.size();
  }
  if (elements > size) {
    std::fprintf(stderr, "%zu elements from %zu bytes\n", elements, size);
    std::abort();
  }
  KvBlockIndex index({.blocks_per_instance = 64, .total_blocks = 96});
  for (const auto& e : b->events) {
    index.apply(1, e);
    index.apply(2, e);
  }
  index.set_state(1, KvFeedState::exact);
  std::vector<std::uint32_t> tokens;
  for (const auto& e : b->events) {
    if (const auto* s = std::get_if<KvBlockStored>(&e)) {
      tokens = s->token_ids;
      break;
    }
  }
  for (const auto& row : index.cached_tokens(tokens)) {
    if (row.tokens > tokens.size())
      std::abort();
  }
  if (index.total_blocks() > 96)
    std::abort();
  return 0;
}
