// What one gateway replica pays to follow engines' KV events
// (docs/kv-events.md, "Several replicas"): decoding and applying batches
// as a vLLM engine sends them after each prefill, and the lookup a pick
// does. Batches are encoded by the sim's encoder (sim/kv_events.hpp), as
// pdgate-sim publishes them.
//
//   build-bench/bench/kv_events_bench
#include <benchmark/benchmark.h>

#include <numeric>

#include "core/routing/kv_block_index.hpp"
#include "plugins/kv_event_decoder.hpp"
#include "sim/kv_events.hpp"

namespace {

constexpr std::size_t kBlockSize = 16;

// A prefill of `blocks` new blocks (its BlockStored), then their eviction
// (BlockRemoved), as two batches: the steady state of a busy engine.
std::pair<std::string, std::string> prefill_batches(std::size_t blocks, std::uint64_t salt,
                                                    pdgate::sim::HashKind hashes) {
  pdgate::sim::BlockStored s;
  s.block_size = kBlockSize;
  for (std::size_t i = 0; i < blocks; ++i)
    s.block_hashes.push_back(salt * 100'000 + i + 1);
  s.token_ids.resize(blocks * kBlockSize);
  std::iota(s.token_ids.begin(), s.token_ids.end(), static_cast<std::uint32_t>(salt * 7));
  pdgate::sim::BlockRemoved r{s.block_hashes};
  using pdgate::sim::EventLayout;
  return {pdgate::sim::encode_batch(1.0, {s}, 0, EventLayout::array, hashes),
          pdgate::sim::encode_batch(1.0, {r}, 0, EventLayout::array, hashes)};
}

// Batches decoded and applied per second; items = blocks stored and removed.
void BM_IngestPrefill(benchmark::State& state) {
  const auto blocks = static_cast<std::size_t>(state.range(0));
  const auto hashes =
      state.range(1) == 0 ? pdgate::sim::HashKind::integer : pdgate::sim::HashKind::bytes;
  const auto [stored, removed] = prefill_batches(blocks, 1, hashes);
  pdgate::KvBlockIndex index;
  const auto as_span = [](const std::string& s) {
    return std::span(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
  };
  for (auto _ : state) {
    for (const auto* payload : {&stored, &removed}) {
      auto b = pdgate::decode_kv_event_batch(as_span(*payload));
      if (!b)
        state.SkipWithError(b.error().c_str());
      for (const auto& e : b->events)
        index.apply(1, e);
    }
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * blocks * 2));
  state.SetBytesProcessed(
      static_cast<std::int64_t>(state.iterations() * (stored.size() + removed.size())));
}
BENCHMARK(BM_IngestPrefill)->Args({32, 0})->Args({32, 1})->Args({256, 0});

// pdgate.cached_tokens()'s index part: a 2,048-token prompt against 8
// instances holding 1,024 blocks each, one of which holds the prompt.
void BM_CachedTokens(benchmark::State& state) {
  pdgate::KvBlockIndex index;
  std::vector<std::uint32_t> prompt(2048);
  std::iota(prompt.begin(), prompt.end(), 0u);
  for (pdgate::InstanceKey k = 1; k <= 8; ++k) {
    pdgate::KvBlockStored s;
    s.block_size = kBlockSize;
    for (std::size_t i = 0; i < 1024; ++i)
      s.block_hashes.push_back(k * 10'000 + i);
    s.token_ids.resize(1024 * kBlockSize);
    std::iota(s.token_ids.begin(), s.token_ids.end(), k == 1 ? 0u : k * 100'000u);
    index.apply(k, s);
    index.set_state(k, pdgate::KvFeedState::exact);
  }
  for (auto _ : state)
    benchmark::DoNotOptimize(index.cached_tokens(prompt));
}
BENCHMARK(BM_CachedTokens);

}  // namespace

BENCHMARK_MAIN();
