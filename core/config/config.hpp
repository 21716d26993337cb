// Everything the gateway can be told, from the command line (three
// drop-in forms, see README) and from a YAML file (--config). Parsing is a
// pure function so every flag is unit-tested without starting a server.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/result.hpp"

namespace pdgate {

enum class Role { prefill, decode, encode, both };

const char* to_string(Role r);
// The inverse of to_string(Role): "prefill", "decode", "encode" or "both".
std::optional<Role> role_from_string(std::string_view s);

// Where an engine publishes its KV-cache events (vLLM's
// --kv-events-config; docs/kv-events.md): its ZMQ PUB socket and,
// optionally, its ROUTER replay socket. Both empty: no events.
struct KvEventsEndpoint {
  std::string endpoint;  // tcp://host:port
  std::string replay;    // tcp://host:port, or empty
  bool operator==(const KvEventsEndpoint&) const = default;
};

// `ev` with its endpoints checked (tcp://host:port or ipc://path; the
// replay one optional), or why not.
Result<KvEventsEndpoint> check_kv_events_endpoint(KvEventsEndpoint ev);

// One engine instance as configured. `url` is normalized to
// "http://host:port" (no trailing slash, no path).
struct UpstreamSpec {
  Role role = Role::decode;
  std::string url;
  std::string host;
  std::uint16_t port = 0;
  // https:// (the engine is spoken to over TLS, core/net/tls_context.hpp).
  bool tls = false;
  // "zmqhost:zmqport" for --kv-connector p2p-nccl (given as url@zmqhost:zmqport).
  std::string kv_peer;
  // Given in a YAML instance list ({url: ..., labels: {...}, weight: N});
  // policies see them as they see the admin API's.
  std::map<std::string, std::string> labels;
  unsigned weight = 1;
  KvEventsEndpoint kv_events;
  // Data parallelism (vLLM's --data-parallel-size behind one API server):
  // the engine's ranks, each routed to as an instance of its own (the
  // registry expands one spec into dp_size instances, rank r's with
  // dp_rank = r), pinned with the X-data-parallel-rank header.
  std::uint32_t dp_size = 1;
  std::optional<std::uint32_t> dp_rank;
  static constexpr std::uint32_t kMaxDataParallelSize = 256;
};

// Rank `rank`'s copy of an engine's spec: its dp_rank set and its KV-event
// endpoints moved as vLLM moves a rank's (tcp: port + rank; ipc: a
// `_dp<rank>` suffix).
UpstreamSpec rank_spec(const UpstreamSpec& engine, std::uint32_t rank);
// The specs of the instances an engine is routed to as: itself, or one
// rank_spec() per data-parallel rank (dp_size, within
// kMaxDataParallelSize), by rank.
std::vector<UpstreamSpec> instance_specs(const UpstreamSpec& engine);
// What identifies one routable instance: its URL, and "#dp<rank>" after
// it for a data-parallel rank (KV-index and load-report keys, logs).
std::string instance_location(const UpstreamSpec& spec);

// Bounds on one instance's labels, whatever gave them (the config file,
// the admin API, another replica through Redis): each policy VM copies
// every label into its state whenever the instance set changes, and
// /status, /admin/instances and the Redis document carry them. In the
// spirit of Kubernetes' label limits, with room for a URL-sized value.
struct LabelLimits {
  static constexpr std::size_t kMaxCount = 64;
  static constexpr std::size_t kMaxKeyBytes = 128;
  static constexpr std::size_t kMaxValueBytes = 1024;
  // Keys and values together.
  static constexpr std::size_t kMaxTotalBytes = 8192;
};
// Why `labels` break LabelLimits (or has an empty name), or nothing: the
// one check every source of labels runs. `owner` names what carries them
// in the message ("instance", "key").
std::optional<std::string> label_problem(const std::map<std::string, std::string>& labels,
                                         std::string_view owner = "instance");

// Instances found in DNS (`dns://NAME:PORT` in an instance list): every
// address NAME resolves to (A and AAAA), on PORT, re-resolved every
// --dns-interval (plugins/dns_discovery.hpp).
struct DnsSource {
  Role role = Role::decode;
  std::string name;
  std::uint16_t port = 0;
  std::string text() const { return "dns://" + name + ":" + std::to_string(port); }
};

struct Config {
  // Client listener.
  std::string host = "0.0.0.0";
  std::uint16_t port = 8000;
  unsigned workers = 0;  // 0: one per core
  // Client connections open at once, all workers together; at the bound
  // the listeners stop accepting (the kernel's backlog holds the rest).
  std::size_t max_connections = 16384;
  // TLS on the client listener (docs/tls.md): PEM certificate (chain) and
  // key; empty: plain HTTP. With a client CA, clients must present a
  // certificate it signed. Reloaded on SIGHUP.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  unsigned tls_min_version = 12;  // 12: TLS 1.2, 13: TLS 1.3

  // Engines.
  std::string model;  // optional; the demo proxy's --model
  std::vector<UpstreamSpec> prefill;
  std::vector<UpstreamSpec> decode;
  std::vector<UpstreamSpec> encode;
  // --prefill-servers-urls disable|none|"": one hop to a combined P+D
  // instance (the decode list), body untouched.
  bool prefill_disabled = false;
  // Instance lists fed by DNS; a role with one may start with no instance.
  std::vector<DnsSource> dns_sources;
  std::chrono::milliseconds dns_interval{5'000};
  std::string dns_server;  // HOST:PORT; empty: the first nameserver of /etc/resolv.conf
  // Instances one dns:// source may contribute, added or being checked.
  unsigned dns_max_instances = 64;
  std::string kv_connector = "nixl";
  // NIXL pull or push: auto follows prefill's answer (transfer_mode).
  std::string nixl_transfer_mode = "auto";
  // Mooncake's legs: parallel (current engines) or sequential (older ones,
  // the NIXL pull form).
  std::string mooncake_legs = "parallel";
  // The port of Mooncake's bootstrap server on each prefill's host
  // (VLLM_MOONCAKE_BOOTSTRAP_PORT); 0: the prefill's own HTTP port.
  std::uint16_t mooncake_bootstrap_port = 8998;
  // How long a prefill keeps its blocks for decode (the engines'
  // kv_lease_duration): a decode leg is never sent later than this after
  // prefill answered.
  std::chrono::milliseconds kv_lease{30'000};

  // Client-side limits.
  std::size_t max_body_bytes = 64u << 20;
  std::size_t max_header_bytes = 64u << 10;
  // What all bodies being received may hold together (core/net/body_budget.hpp).
  std::size_t body_memory_limit = std::size_t{1} << 30;
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds client_idle_timeout{75'000};
  // API keys (core/pipeline/client_keys.hpp): a YAML file of hashed keys, and/or
  // keys shared through Redis; limits shared through Redis when --redis is
  // set. What to do when Redis cannot answer a limit check.
  std::string api_keys_file;
  bool api_keys_from_redis = false;
  bool limits_fail_open = true;

  // Upstream behaviour.
  std::chrono::milliseconds connect_timeout{5'000};
  std::chrono::milliseconds first_byte_timeout{600'000};
  std::chrono::milliseconds upstream_idle_timeout{60'000};
  std::size_t upstream_max_idle = 64;  // idle keep-alive connections per instance per worker
  // What all whole engine answers being read may hold together
  // (non-streamed answers, prefill and encoder answers, error bodies).
  std::size_t answer_memory_limit = std::size_t{1} << 30;
  // Multimodal fan-out (core/pipeline/encode_phase.hpp): media items a
  // request may carry, encoder calls one request makes at once, and
  // encoder calls a worker makes at once for all its requests.
  std::size_t encode_max_items = 1024;
  std::size_t encode_concurrency = 16;
  std::size_t encode_max_inflight = 256;
  // TLS to https:// engines: the CA bundle (empty: the system store), an
  // optional client certificate and key (mTLS), and whether certificates
  // go unchecked.
  std::string upstream_ca;
  std::string upstream_cert;
  std::string upstream_key;
  bool upstream_insecure = false;

  // Routing policies (docs/policies.md): a shipped policy's name or a .lua
  // path, for all stages or per stage (empty: `policy`).
  std::string policy = "round_robin";
  std::string policy_prefill;
  std::string policy_decode;
  std::string policy_encode;
  std::string policy_dir;  // names are looked up here before the shipped ones
  std::chrono::microseconds policy_budget{1000};
  std::size_t policy_memory = 64u << 20;  // per Lua state (one per worker)
  std::size_t prefix_block_size = 256;    // bytes of prompt text per prefix block hash
  std::chrono::milliseconds policy_poll_interval{1000};
  // --policy-log-level NAME=LEVEL: a policy's own log level for its
  // pdgate.log lines (name as in metrics), whatever log_level says.
  std::vector<std::pair<std::string, std::string>> policy_log_levels;
  // How often each engine's /metrics is scraped; 0 turns scraping off.
  std::chrono::milliseconds metrics_interval{250};
  // Multi-turn KV reuse (docs/conversations.md).
  std::string redis_url;  // empty: the in-memory store
  std::string redis_key_prefix = "pdgate:";
  std::chrono::milliseconds redis_timeout{50};
  // rediss:// (and rediss+sentinel://): the CA bundle the servers'
  // certificates must chain to (empty: the system store), and a client
  // certificate and key presented when set.
  std::string redis_tls_ca;
  std::string redis_tls_cert;
  std::string redis_tls_key;
  // With redis_url: replicas share their prefix and conversation routing
  // records (core/routing/kv_location_index.hpp).
  bool shared_kv_index = true;
  // With --redis: replicas share their load (plugins/redis_load_sync.hpp);
  // 0 = off.
  std::chrono::milliseconds load_sync_interval{1};
  std::chrono::milliseconds load_sync_expiry{1000};
  // A policy's pdgate.RECHECK waits this long per busy replica ahead of
  // this one (core/upstream/replica_order.hpp); 0: it asks again at once.
  std::chrono::milliseconds load_sync_recheck_slot{10};
  std::chrono::seconds conversation_ttl{450};
  // The exact KV-block index fed by engines' events (docs/kv-events.md):
  // blocks kept per instance and in all, how long a replay may take, and
  // how requests are turned into token ids for it (none, sim, vllm).
  std::size_t kv_index_blocks_per_instance = 262'144;
  std::size_t kv_index_max_blocks = 2'000'000;
  std::chrono::milliseconds kv_events_replay_timeout{2'000};
  std::string tokenizer = "none";
  std::chrono::milliseconds tokenizer_timeout{1'000};
  std::size_t conversation_cache_size = 100000;
  // Lowercase header naming the client for reuse (e.g. x-tenant-id); empty:
  // the Authorization credential.
  std::string conversation_scope_header;
  // Requests that name no client (no API key, no credential, no scope
  // header) share one anonymous scope, guarded by the exact-history check
  // (docs/conversations.md); false gives them no reuse.
  bool conversation_anonymous_reuse = true;
  // Tokens held against a key's tokens_per_minute for a completion that
  // sets no max_tokens, until its real count is known.
  std::uint64_t token_reserve = 1024;
  bool expose_kv_params = false;
  // Client-facing errors name the stage and the kind of failure; with this
  // set they also carry engine addresses and engines' error text.
  bool verbose_errors = false;
  // POST /start_profile and /stop_profile on the client port.
  bool profile_routes = true;

  // Admin listener (docs/admin.md). Port 0 with admin_enabled false: off.
  bool admin_enabled = false;
  std::string admin_host = "127.0.0.1";
  std::uint16_t admin_port = 0;
  std::string admin_key_file;  // else env ADMIN_API_KEY
  // TLS on the admin listener, as the client listener's (same minimum
  // version); empty: plain HTTP. Reloaded on SIGHUP.
  std::string admin_tls_cert;
  std::string admin_tls_key;
  std::string admin_tls_client_ca;
  // Bound on an admin add's name resolution and GET /v1/models check.
  std::chrono::milliseconds model_check_timeout{5'000};
  // SIGTERM: in-flight requests get this long to finish, then pdgate exits.
  std::chrono::milliseconds shutdown_timeout{30'000};
  // CIDRs an added instance's address must fall in (empty: any).
  std::vector<std::string> allowed_upstreams;

  // Health: active GET /health every interval (0: off), rise/fall
  // consecutive results; passive ejection after eject_after consecutive
  // connect errors, timeouts or 5xx.
  std::chrono::milliseconds health_interval{2'000};
  unsigned health_rise = 2;
  unsigned health_fall = 2;
  unsigned eject_after = 3;
  // Health checks in flight at most; also bounds the engine-metrics
  // scrapes and the validation of instances learnt through Redis (each
  // on its own).
  unsigned health_max_concurrency = 64;
  // Retries in flight may be at most this fraction of requests in flight
  // (at least one), so an outage cannot turn into a retry storm.
  double retry_budget = 0.2;
  // A stream whose decode breaks off after its first event is resumed on
  // another decode at most this many times (docs/resumption.md); 0: the
  // client gets the in-band error event.
  unsigned decode_migrations = 1;
  // Resumable streams ask their engines for token ids (vLLM's
  // return_token_ids), kept from clients that did not ask, so a resumed
  // stream goes on token-exact (docs/resumption.md).
  bool resume_token_ids = false;

  // Tracing (docs/tracing.md). Spans go to otlp_endpoint over OTLP/HTTP
  // (empty: no spans, and engines get the client's traceparent as sent).
  std::string otlp_endpoint;
  // https:// endpoints: the CA bundle the collector's certificate must
  // chain to (empty: the system store).
  std::string otlp_ca;
  // Of the traces pdgate starts; a client's traceparent decides its own.
  double trace_sample_ratio = 1.0;
  std::size_t otlp_batch_size = 512;
  std::chrono::milliseconds otlp_export_interval{1000};
  std::size_t otlp_queue_size = 8192;  // spans waiting for export; more are dropped
  std::chrono::milliseconds otlp_timeout{5000};
  // Engine requests also carry these client headers (lowercase names),
  // when the client sent them, and these fixed ones (validated: no
  // hop-by-hop, framing or pdgate-set names, no CR/LF).
  std::vector<std::string> forward_headers;
  std::vector<std::pair<std::string, std::string>> set_headers;

  std::string log_level = "info";
  // One line per request (core/gateway/access_log.hpp): a file path, "stderr" or
  // "off"; "text" or "json".
  std::string access_log = "off";
  std::string access_log_format = "text";
  std::string config_file;  // the --config path, if any
};

// An http:// or https:// URL split for a client: host, port (80, or 443
// for https://, when not given) and the request target (`default_target`
// when the URL has no path).
struct HttpEndpoint {
  std::string host;
  std::uint16_t port = 80;
  std::string target;
  bool tls = false;  // https://
};
Result<HttpEndpoint> parse_http_endpoint(std::string_view url, std::string_view default_target);

// What the command line asked for: run with a config, or print help.
struct CommandLine {
  Config config;
  bool help = false;
  bool version = false;  // --version: print it and exit
  // --check-config: parse and validate everything (flags, the YAML file,
  // policy scripts), report, and exit without serving.
  bool check_only = false;
};

// Parses argv (argv[0] is skipped). Loads --config first, then applies the
// flags on top of it, so flags override the file. On mistakes it goes on
// reading and returns every one, a line each, each naming its flag or key.
Result<CommandLine> parse_command_line(int argc, const char* const* argv);
// The same, but never giving up: every mistake is appended to `errors`
// and the result is what could be read (a value in error left at its
// default), so --check-config can go on to load the files it names.
CommandLine read_command_line(int argc, const char* const* argv, std::vector<std::string>& errors);

// Parses a YAML document (the --config file's text) into `base`.
Result<Config> apply_yaml(Config base, const std::string& yaml_text);

// Parses "host:port", "http://host:port" or "http://host:port/" into a spec.
// An empty host ("http://:8100") means localhost, as vLLM's scripts assume.
Result<UpstreamSpec> parse_upstream(Role role, const std::string& text);
// "dns://name:port" (the caller has seen the scheme).
Result<DnsSource> parse_dns_source(Role role, std::string_view text);

// The --help text, one paragraph per flag.
std::string help_text();

// Checks cross-field rules (at least one decode, ports given, no instance
// listed twice, ...). Every broken rule is reported, a line each.
Result<Config> validate(Config c);

// One option's effective value, as GET /admin/config shows it and a reload
// compares it: the option's key (its long flag without dashes), its value
// in the syntax the flag takes (secrets masked), and whether a change
// needs a restart.
struct ConfigEntry {
  std::string key;
  std::vector<std::string> values;  // one item unless the option takes a list
  bool list = false;
  bool restart = false;
};
// Every option a config file may set, in --help order.
std::vector<ConfigEntry> effective_config(const Config& c);

// What a reload from `before` to `after` changes: keys applied at run time
// and keys that differ but need a restart (left as they were).
struct ConfigDiff {
  std::vector<std::string> applied;
  std::vector<std::string> restart_needed;
};
ConfigDiff diff_config(const Config& before, const Config& after);

// `c` with every restart-only setting taken from `running`: what a reload
// applies.
Config reloadable_part(const Config& running, Config c);

// Masks the password of a redis://[user:]password@host URL.
std::string mask_url_password(const std::string& url);

}  // namespace pdgate
