// Serving a generation request (/v1/completions, /v1/chat/completions) the
// way the simulated engine would: admission to the batch, the KV pull, the
// prefix-cache lookup and the prefill, one decode step per output token,
// then the answer, whole or streamed token by token.
#pragma once

#include <cstddef>

#include <spdlog/fwd.h>

#include "sim/cache_events.hpp"
#include "sim/faults.hpp"
#include "sim/generation_request.hpp"
#include "sim/http_exchange.hpp"
#include "sim/kv_transfer.hpp"
#include "sim/latency.hpp"
#include "sim/metrics.hpp"
#include "sim/options.hpp"
#include "sim/prefix_cache.hpp"
#include "sim/scheduler.hpp"

namespace pdgate::sim {

class Generator {
 public:
  Generator(const SimOptions& opts, spdlog::logger& log, Counters& counters, Faults& faults,
            KvTransfer& kv, PrefixCache& cache, CacheEvents& cache_events);

  // Serves one request; any failure before the answer started becomes a 500.
  awaitable<void> generate(Exchange& x, SimApi api);

  std::size_t running() const { return scheduler_.running(); }
  std::size_t waiting() const { return scheduler_.waiting(); }
  // KV blocks the running requests hold.
  std::size_t active_blocks() const { return active_blocks_; }

 private:
  awaitable<void> generate_inner(Exchange& x, SimApi api);

  const SimOptions& opts_;
  spdlog::logger& log_;
  Counters& counters_;
  Faults& faults_;
  KvTransfer& kv_;
  PrefixCache& cache_;
  CacheEvents& cache_events_;
  LatencyModel latency_;
  Scheduler scheduler_;
  Scheduler prefill_lanes_;
  std::size_t active_blocks_ = 0;
};

}  // namespace pdgate::sim
