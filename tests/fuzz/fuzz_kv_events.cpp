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
#include <string>
#include <vector>

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
  // Looked up as the base model and as each adapter the events named
  // (LoRA roots, groups, media and extra keys all take part).
  std::vector<std::uint32_t> tokens;
  std::vector<std::string> models = {""};
  for (const auto& e : b->events) {
    if (const auto* s = std::get_if<KvBlockStored>(&e)) {
      if (tokens.empty())
        tokens = s->token_ids;
      if (s->lora_name && models.size() < 4)
        models.push_back(*s->lora_name);
      if (!s->extra_keys.empty() && s->extra_keys.size() != s->block_hashes.size())
        std::abort();
    }
  }
  for (const auto& model : models) {
    for (const auto& row : index.cached_tokens(tokens, model)) {
      if (row.tokens > tokens.size())
        std::abort();
    }
  }
  for (const auto& row : index.instances()) {
    if (row.blocks > 64)
      std::abort();
  }
  if (index.total_blocks() > 96)
    std::abort();
  return 0;
}
