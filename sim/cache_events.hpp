// The prefix cache as requests change it, kept in step with vLLM's KV
// cache events: with --kv-events-config on, every insert that stores or
// evicts blocks, and every reset, is published as one batch, so a router
// following the events sees the cache this engine really has.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <spdlog/fwd.h>

#include "sim/kv_events.hpp"
#include "sim/options.hpp"
#include "sim/prefix_cache.hpp"

namespace pdgate::sim {

class KvEventPublisher;

class CacheEvents {
 public:
  // `events` is null when KV events are off.
  CacheEvents(PrefixCache& cache, KvEventPublisher* events, const SimOptions& opts,
              spdlog::logger& log)
      : cache_(cache), events_(events), opts_(opts), log_(log) {}

  // Inserts a block chain (the hashes of `text`'s blocks) and publishes what
  // changed, once per KV-cache group (--kv-cache-groups), the blocks of a
  // LoRA adapter (`lora`, one of --lora-modules; empty: the base model)
  // named as such; returns the blocks' ids, as PrefixCache::insert does.
  std::vector<std::int64_t> insert(std::string_view text, const std::vector<std::uint64_t>& hashes,
                                   std::string_view lora = {});

  // Empties the cache (POST /reset_prefix_cache) and publishes
  // AllBlocksCleared.
  void clear();

 private:
  void publish(const std::vector<KvEvent>& events);

  PrefixCache& cache_;
  KvEventPublisher* events_;
  const SimOptions& opts_;
  spdlog::logger& log_;
};

}  // namespace pdgate::sim
