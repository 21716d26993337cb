// The prefill->decode KV hand-off, NIXL-like: a prefill (or, with
// --issue-decode-kv, any finished request) issues kv_transfer_params naming
// its blocks; the engine that receives those params pulls the blocks from
// the issuer over HTTP (POST /sim/kv/pull), and the issuer answers whether
// they were there to take (kv_registry.hpp keeps that record).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>

#include <spdlog/fwd.h>
#include <nlohmann/json.hpp>

#include "sim/cache_events.hpp"
#include "sim/generation_request.hpp"
#include "sim/http_exchange.hpp"
#include "sim/kv_registry.hpp"
#include "sim/metrics.hpp"
#include "sim/options.hpp"
#include "sim/prefix_cache.hpp"
#include "sim/request_log.hpp"
#include "sim/responses.hpp"

namespace pdgate::sim {

class KvTransfer {
 public:
  // `port` is the one the sim listens on, put in the params it issues.
  // `rng` is the engine's seeded RNG, which makes the remote_request_ids.
  KvTransfer(const SimOptions& opts, spdlog::logger& log, std::mt19937_64& rng, Counters& counters,
             PrefixCache& cache, CacheEvents& cache_events, std::uint16_t port);

  const std::string& engine_id() const { return registry_.engine_id(); }
  // The params issued and not yet pulled, for the gauges.
  KvRegistry& registry() { return registry_; }

  // What a request's KV pull saves it.
  struct Received {
    bool skip_prefill = false;      // the whole prompt's KV arrived
    std::size_t remote_cached = 0;  // prompt tokens whose blocks arrived
    // The request fails (Mooncake: prefill's KV never came, as vLLM's
    // kv_load_failure_policy "fail", its default).
    std::optional<std::string> failure;
  };
  // The receiving side: when the request's params call for a pull (a
  // decode, or a prefill handed the decode's previous-turn blocks), asks
  // their issuer for the blocks and notes the outcome in `rec`.
  awaitable<Received> receive(const GenRequest& g, const std::string& rid, RequestRecord& rec);

  // Issues params for the blocks of `text` (`tokens` long), caching them
  // here until a peer pulls them or they expire: a prefill's (`lease`)
  // after --kv-lease-ms, a decode's for the next turn after --kv-expiry-s.
  ojson issue(const std::string& rid, const std::string& text, std::size_t tokens, bool lease);

  // Mooncake: a prefill keeps its blocks under the gateway's transfer id
  // (for --kv-lease-ms) until the decode leg that waits for them takes them.
  void publish(const std::string& transfer_id, const std::string& text, std::size_t tokens);

  // The issuer side: a peer pulls params we issued.
  awaitable<bool> serve_pull(Exchange& x);

 private:
  awaitable<KvResult> pull(const nlohmann::json& kv, const std::string& rid);
  // Mooncake: asks prefill's bootstrap address for the transfer until it
  // is there or --kv-wait-ms passed.
  awaitable<KvResult> wait_for_transfer(const nlohmann::json& kv, const std::string& rid,
                                        std::string& why);
  awaitable<KvResult> pull_http(const std::string& host, std::uint16_t port,
                                const nlohmann::json& payload, std::string& why);

  const SimOptions& opts_;
  spdlog::logger& log_;
  std::mt19937_64& rng_;
  Counters& counters_;
  PrefixCache& cache_;
  CacheEvents& cache_events_;
  std::uint16_t port_;
  KvRegistry registry_;
};

}  // namespace pdgate::sim
