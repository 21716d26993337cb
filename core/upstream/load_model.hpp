// What a request would cost on an instance, from the figures every
// gateway replica shares (core/upstream/cluster_load.hpp) and what the
// engine itself reports: the one definition the policies' helpers
// (pdgate.load, pdgate.least_loaded, pdgate.predicted_ttft), the admin
// API and /metrics use.
//
// Prefill is bound by tokens: an engine computes the prompts queued on it
// about one after another, so a new prompt waits for the uncached tokens
// queued ahead of it, cluster-wide, then its own. Its time to first token
// is predicted as
//
//   (queued tokens + kBaseTokens x requests ahead + own uncached tokens
//    + kBaseTokens) x ms per token
//
// with the engine's ms per token learnt from its completed prefills (the
// ratio of their decayed total time to the tokens they waited for), and,
// for an engine not yet learnt, the mean of those that are. Decode
// pressure is the count of requests running there (every replica's plus
// what the engine reports beyond them) and the engine's KV-cache use.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/upstream/instance.hpp"

namespace pdgate {

// Engine metrics older than this describe a past routing should not trust.
inline constexpr std::int64_t kEngineMetricsFreshMs = 10'000;
// The fixed cost of a prompt (scheduling, the first decode step), in
// tokens' worth of work, so that a fully cached prompt is not free.
inline constexpr std::int64_t kBaseTokens = 16;

// Requests in flight on the instance: every replica's, plus, when the
// engine's metrics are fresh, the load it reports beyond them.
std::int64_t routing_load(const Instance& inst, std::int64_t steady_now_ms);

// The engine's learnt ms per token, else `fleet` (see fleet_ms_per_token).
double ms_per_token(const Instance& inst, double fleet);
// The mean learnt ms per token of `list`, or 0 when none is learnt (all
// then cost the same per token, and predictions compare tokens).
double fleet_ms_per_token(const std::vector<InstancePtr>& list);

// Predicted milliseconds to the first token of a prompt of which
// `uncached_tokens` must be computed on `inst`. With no learnt cost
// anywhere (fleet 0) the figure is in tokens.
double predicted_ttft_ms(const Instance& inst, std::int64_t uncached_tokens, double fleet,
                         std::int64_t steady_now_ms);

// What computing `cached_tokens` again would cost at the fleet's rate
// (an engine's own rate would make a slow engine's cache look worth more).
double cached_worth_ms(std::int64_t cached_tokens, double fleet);

// The prompt's length in tokens: the engine's count when it was asked
// (--tokenizer vllm), else the estimate every limit and policy uses.
std::int64_t prompt_tokens(const PickContext& ctx);

// A cold prompt's home. Replicas behind one balancer decide concurrent
// requests on figures a few milliseconds old: two requests with the same
// new prefix, arriving at two replicas within that time, each look cold
// to both, and a tie broken by each replica's own rotation computes the
// prefix on two engines (and evicts something else for it). Instead,
// among the candidates whose predicted start is the soonest (within
// kHomeSlack of this prompt's own compute time), the one ranking highest
// for the prompt's leading kHomeBytes (rendezvous hashing) takes it: every
// replica ranks the same way, so they agree without talking. Only ties:
// a slack of 0.1 to 0.5 of the prompt's compute time made the homes win
// over a less loaded engine, and lost hits and tail latency with a single
// replica (bench/README.md, "Routing quality").
inline constexpr std::size_t kHomeBytes = 2048;
inline constexpr double kHomeSlack = 0.0;

// Where `prompt_key` ranks on the instance named `instance_key`.
std::uint64_t home_rank(std::uint64_t prompt_key, std::uint64_t instance_key);
// The position in `costs` of the cold prompt's home: among the eligible
// candidates (cost not NaN) within `slack` of the least cost, the one whose
// key in `keys` ranks highest. costs.size() when none is eligible.
std::size_t home_among(std::span<const double> costs, std::span<const std::uint64_t> keys,
                       std::uint64_t prompt_key, double slack);

// Learns from one completed prefill: `waited_tokens` (queued ahead when
// it was sent, plus what it computed itself) took `elapsed_ms`.
void note_prefill_time(const Instance& inst, std::int64_t waited_tokens, double elapsed_ms);

}  // namespace pdgate
