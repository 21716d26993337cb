#include "core/upstream/load_model.hpp"

#include "core/routing/request_hook.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>

namespace pdgate {

namespace {

// How much of the learnt sums each new sample replaces: a few dozen
// prefills make an estimate, and an engine that slows down is noticed
// within them.
constexpr double kAlpha = 0.1;
// Samples are clamped so that one absurd timing (a stalled connection, a
// clock step) cannot make an engine look free or unusable for long.
constexpr double kMinMsPerToken = 1e-5;
constexpr double kMaxMsPerToken = 100.0;
// Engines whose learnt costs are within this factor of the fleet's mean
// are priced alike.
constexpr double kSameSpeed = 1.5;
// Once an engine's cost is learnt, a sample counts as at most this many
// times it (or at least its inverse).
constexpr double kSampleSpread = 4.0;

}  // namespace

std::int64_t routing_load(const Instance& inst, std::int64_t steady_now_ms) {
  std::int64_t l = inst.cluster_in_flight();
  const std::int64_t at = inst.metrics_at_ms.load(std::memory_order_relaxed);
  if (at != 0 && steady_now_ms - at < kEngineMetricsFreshMs)
    l += inst.engine_other_load.load(std::memory_order_relaxed);
  return l;
}

double ms_per_token(const Instance& inst, double fleet) {
  const double own = inst.prefill_ms_per_token.load(std::memory_order_relaxed);
  if (own <= 0)
    return fleet;
  // An estimate from a few dozen prefills is noisy (queues measured a few
  // milliseconds late, batching): engines of one speed must not look
  // different, or every cold prompt goes to whichever looked cheapest and
  // its cache churns (four replicas, each learning from a quarter of the
  // prefills, lost 0.06 of the hit rate that way). Only an engine clearly
  // faster or slower than the fleet is priced on its own.
  if (fleet > 0 && own < fleet * kSameSpeed && own > fleet / kSameSpeed)
    return fleet;
  return own;
}

double fleet_ms_per_token(const std::vector<InstancePtr>& list) {
  double sum = 0;
  std::size_t n = 0;
  for (const auto& inst : list) {
    const double v = inst->prefill_ms_per_token.load(std::memory_order_relaxed);
    if (v > 0) {
      sum += v;
      ++n;
    }
  }
  return n == 0 ? 0.0 : sum / static_cast<double>(n);
}

namespace {

// With no cost learnt anywhere, a token costs 1: predictions compare tokens.
double or_unit(double ms_per_token) {
  return ms_per_token > 0 ? ms_per_token : 1.0;
}

}  // namespace

double cached_worth_ms(std::int64_t cached_tokens, double fleet) {
  return static_cast<double>(std::max<std::int64_t>(cached_tokens, 0)) * or_unit(fleet);
}

std::int64_t prompt_tokens(const PickContext& ctx) {
  if (ctx.token_ids != nullptr)
    return static_cast<std::int64_t>(ctx.token_ids->size());
  return static_cast<std::int64_t>(estimated_prompt_tokens(ctx.prompt_raw.size()));
}

double predicted_ttft_ms(const Instance& inst, std::int64_t uncached_tokens, double fleet,
                         std::int64_t steady_now_ms) {
  // Every request ahead costs its fixed part; those sent by a replica
  // also their queued prompt tokens. The engine's own count beyond the
  // replicas' (fresh metrics only) is of prompts pdgate never saw, whose
  // sizes it cannot know: they count at the fixed cost.
  const std::int64_t requests_ahead = routing_load(inst, steady_now_ms);
  const std::int64_t tokens = inst.cluster_queued_tokens() + kBaseTokens * requests_ahead +
                              std::max<std::int64_t>(uncached_tokens, 0) + kBaseTokens;
  return static_cast<double>(tokens) * or_unit(ms_per_token(inst, fleet));
}

std::uint64_t home_rank(std::uint64_t prompt_key, std::uint64_t instance_key) {
  // splitmix64's finaliser: a rank must depend on every bit of both keys
  // (an instance key is FNV-1a, whose low bits mix poorly).
  std::uint64_t z = prompt_key ^ (instance_key * 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::size_t home_among(std::span<const double> costs, std::span<const std::uint64_t> keys,
                       std::uint64_t prompt_key, double slack) {
  const std::size_t n = std::min(costs.size(), keys.size());
  double least = 0;
  bool any = false;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isnan(costs[i]) && (!any || costs[i] < least)) {
      least = costs[i];
      any = true;
    }
  }
  std::size_t best = costs.size();
  std::uint64_t best_rank = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(costs[i]) || costs[i] > least + slack)
      continue;
    const std::uint64_t r = home_rank(prompt_key, keys[i]);
    if (best == costs.size() || r > best_rank) {
      best = i;
      best_rank = r;
    }
  }
  return best;
}

void note_prefill_time(const Instance& inst, std::int64_t waited_tokens, double elapsed_ms) {
  if (waited_tokens <= 0 || !(elapsed_ms >= 0))
    return;
  const double tokens = static_cast<double>(waited_tokens + kBaseTokens);
  std::lock_guard lock(inst.prefill_cost_mu);
  const double learnt =
      inst.prefill_cost_tokens > 0 ? inst.prefill_cost_ms / inst.prefill_cost_tokens : 0.0;
  // A sample is bounded absolutely, and, once something is learnt, to
  // within kSampleSpread of it: a real change of speed is still followed
  // (by up to a third per sample), one absurd timing is not believed.
  double lo = kMinMsPerToken, hi = kMaxMsPerToken;
  if (learnt > 0) {
    lo = std::max(lo, learnt / kSampleSpread);
    hi = std::min(hi, learnt * kSampleSpread);
  }
  const double ms = std::clamp(elapsed_ms, tokens * lo, tokens * hi);
  // The ratio of decayed sums, not a mean of ratios: a prefill's time is
  // its wait for what queued ahead plus its own compute, and what queued
  // ahead is known only as well as this replica saw it. A short prompt
  // that waited behind work nobody had reported yet (other replicas'
  // picks of the same millisecond, a prefix the engine had evicted) gives
  // a per-token ratio tens of times the engine's; averaged as a ratio, one
  // such sample made an engine look 5-50x slower for dozens of prefills,
  // priced it on its own, and sent its cached prefixes elsewhere
  // (bench/README.md, "Picks that miss each other"). Weighed by its
  // tokens, it moves the estimate by what it is worth.
  inst.prefill_cost_ms = inst.prefill_cost_ms * (1 - kAlpha) + ms;
  inst.prefill_cost_tokens = inst.prefill_cost_tokens * (1 - kAlpha) + tokens;
  inst.prefill_ms_per_token.store(inst.prefill_cost_ms / inst.prefill_cost_tokens,
                                  std::memory_order_relaxed);
}

}  // namespace pdgate
