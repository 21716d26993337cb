// Command line of pdgate-sim and the per-request fault header. Both are pure
// parsers so every flag and fault form is unit-tested without a server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/kv_events.hpp"

namespace pdgate::sim {

enum class SimRole { prefill, decode, both, encode };

const char* to_string(SimRole r);

struct SimOptions {
  SimRole role = SimRole::both;
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  // With both: serve https (PEM certificate chain and key).
  std::string tls_cert;
  std::string tls_key;
  std::string model = "sim-model";
  std::string engine_id;       // empty: a random UUID is generated at startup
  std::string advertise_host;  // empty: same as host
  double prefill_us_per_token = 50.0;
  double prefill_base_ms = 2.0;
  double itl_ms = 10.0;
  std::size_t max_num_seqs = 16;
  std::size_t max_waiting = 1024;
  std::size_t max_model_len = 32768;
  std::size_t block_size = 16;
  std::size_t kv_blocks = 8192;
  bool prefix_cache = true;
  std::size_t default_max_tokens = 16;
  double error_rate = 0.0;
  std::optional<std::size_t> die_after_chunks;
  // Streaming: after N data events, send nothing more and keep the
  // connection open (a decode whose GPU hung).
  std::optional<std::size_t> stall_after_chunks;
  bool hang = false;
  bool issue_decode_kv = false;
  bool no_profile = false;
  // The KV connector the engines pretend to use: nixl|p2p-nccl|lmcache|none.
  std::string kv_connector = "nixl";  // /start_profile, /stop_profile answer 404 (profiler off)
  std::optional<std::uint64_t> seed;
  std::string log_level = "info";
  // Extensions beyond the vLLM-like surface, so tests can shorten timeouts.
  double kv_pull_ms = 1.0;                // fixed cost of a successful KV pull on decode
  std::size_t kv_pull_timeout_ms = 2000;  // whole pull HTTP exchange
  std::size_t kv_expiry_s = 480;          // VLLM_NIXL_ABORT_REQUEST_TIMEOUT
  // How long a prefill holds the blocks it issued params for (vLLM's
  // kv_lease_duration, 30 s); a decode pulling later finds nothing.
  std::size_t kv_lease_ms = 30000;
  // How long a Mooncake decode leg waits for prefill's KV.
  std::size_t kv_wait_ms = 480000;
  // NIXL pull or push (NixlPullConnector / NixlPushConnector): a prefill
  // says it in its params' transfer_mode; a push decode registers with
  // prefill and needs its coordinates, not its block ids.
  std::string kv_transfer_mode = "pull";
  // vLLM's --enable-prompt-tokens-details: usage reports
  // prompt_tokens_details.cached_tokens.
  bool enable_prompt_tokens_details = false;
  // Fault injection: a field left out of the params a prefill issues.
  std::string kv_params_drop;
  std::size_t prefill_lanes = 1;  // concurrent prefills; 0 = unlimited
  // vLLM's --kv-events-config, and how the events are encoded.
  KvEventsConfig kv_events;
  HashKind kv_events_hash = HashKind::integer;
  EventLayout kv_events_format = EventLayout::vllm;
  // The model's KV-cache groups, as its events name them (--kv-cache-groups).
  std::vector<CacheGroup> kv_cache_groups{CacheGroup{}};
  // LoRA adapters served besides the base model (--lora-modules NAME[=PATH]):
  // a request naming one is served, its blocks published with lora_name.
  std::vector<std::string> lora_modules;
  // vLLM's --data-parallel-size behind one API server (its internal load
  // balancer): that many engine cores, each with its own scheduler, prefix
  // cache, KV-event socket (endpoint port + rank) and engine id
  // (`<id>_dp<rank>`). A request's X-data-parallel-rank header pins it to
  // one; without it the least busy core takes it.
  std::size_t data_parallel_size = 1;
  // Which core an options copy describes (set by the server per core).
  std::size_t data_parallel_rank = 0;
};

struct ParseOutcome {
  std::optional<SimOptions> options;  // set on success
  bool help = false;                  // --help was given
  std::string error;                  // set on failure
};

ParseOutcome parse_args(const std::vector<std::string>& args);
std::string usage_text();

// X-Sim-Fault: comma-separated items among `error`, `error=NNN`, `hang`,
// `die-after=N`, `stall-after=N`, `error-after=N`, `delay-ms=N`, `stall-body=N`.
struct Fault {
  std::optional<int> error_status;  // answer this status instead of working
  bool hang = false;
  std::optional<std::size_t> die_after;    // streaming: drop the socket after N events
  std::optional<std::size_t> error_after;  // streaming: error event + [DONE] after N events
  std::optional<std::size_t> stall_after;  // streaming: go silent after N events, socket open
  std::size_t delay_ms = 0;
  // Interim answers (103 Early Hints) sent before the real one, as a
  // server in front of an engine may.
  std::size_t interim = 0;
  // Whole answers: send a header declaring N+1 body bytes and N of them,
  // then hang (an engine that stalls on the last byte of a huge answer).
  std::optional<std::size_t> stall_body;
};

struct FaultParse {
  Fault fault;
  std::string error;  // non-empty: the header was malformed
};

FaultParse parse_fault_header(std::string_view value);

}  // namespace pdgate::sim
