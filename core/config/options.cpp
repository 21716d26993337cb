// The option table: every option once, with its names, help line and
// binding (how its value is set, shown and kept across a reload), and what
// is derived from it by name: the lookups the YAML loader and the
// command-line parser use, and the --help text.
#include <array>
#include <span>
#include <string>
#include <string_view>

#include "core/config/config.hpp"
#include "core/config/detail/fields.hpp"
#include "core/config/detail/option_table.hpp"
#include "core/config/detail/values.hpp"

namespace pdgate::config_detail {
namespace {

constexpr bool kRestart = true;

constexpr std::string_view kListener = "Listener";
constexpr std::string_view kEngines = "Engines";
constexpr std::string_view kLimits = "Client limits";
constexpr std::string_view kUpstream = "Upstream";
constexpr std::string_view kPolicies = "Policies";
constexpr std::string_view kGeneral = "General";
constexpr std::string_view kTracing = "Tracing and forwarded headers";

constexpr std::array kOptions = {
    Option{"host", "", 0, false, false, kListener, "HOST",
           "Address to listen on for clients (default: 0.0.0.0).",
           checked_text_field<&set_host, &Config::host>, kRestart},
    Option{"port", "", 0, false, false, kListener, "PORT",
           "Port to listen on; 0 picks a free one (default: 8000).",
           Binding{&set_port, &show_number<&Config::port>, &copy_field<&Config::port>}, kRestart},
    Option{"workers", "", 0, false, false, kListener, "N",
           "Worker threads, at most 1024; 0 means one per CPU core (default: 0).",
           uint_field<&Config::workers, 1024>, kRestart},
    Option{"max-connections", "", 0, false, false, kListener, "N",
           "Client connections open at once, all workers together; at the bound the listener "
           "stops accepting until one closes (default: 16384).",
           uint_field<&Config::max_connections, (1u << 24)>},
    // The TLS files are re-read on every reload (core/net/tls_context.hpp), from
    // the paths given at start.
    Option{"tls-cert", "", 0, false, false, kListener, "FILE",
           "Serve clients over TLS with this PEM certificate (its chain after it); re-read "
           "on SIGHUP (default: none, plain HTTP).",
           trimmed_field<&Config::tls_cert>, kRestart},
    Option{"tls-key", "", 0, false, false, kListener, "FILE",
           "The PEM private key of --tls-cert; re-read on SIGHUP (default: none).",
           trimmed_field<&Config::tls_key>, kRestart},
    Option{"tls-client-ca", "", 0, false, false, kListener, "FILE",
           "Require client certificates signed by a CA in this PEM file (mutual TLS); "
           "re-read on SIGHUP (default: none, no client certificate asked).",
           trimmed_field<&Config::tls_client_ca>, kRestart},
    Option{"tls-min-version", "", 0, false, false, kListener, "1.2|1.3",
           "Oldest TLS version clients may use (default: 1.2).",
           Binding{&set_tls_version, &show_tls_version, &copy_field<&Config::tls_min_version>},
           kRestart},

    Option{"model", "", 'm', false, false, kEngines, "NAME",
           "Model name, as the demo proxy's --model; optional (default: none).",
           text_field<&Config::model>, kRestart},
    Option{"prefill", "", 'p', true, false, kEngines, "HOST:PORT",
           "Demo-proxy form: prefill instances, one or more (default: none).",
           Binding{.show = &show_prefill}},
    Option{"decode", "", 'd', true, false, kEngines, "HOST:PORT",
           "Demo-proxy form: decode instances, one or more (default: none).",
           Binding{.show = &show_decode}},
    Option{"prefiller-host", "prefiller-hosts", 0, true, false, kEngines, "HOST",
           "Multi-turn form: prefill hosts, paired with --prefiller-port (default: localhost).",
           Binding{.show = &show_prefiller_hosts}},
    Option{"prefiller-port", "prefiller-ports", 0, true, false, kEngines, "PORT",
           "Multi-turn form: prefill ports, one per host (default: 8100).",
           Binding{.show = &show_prefiller_ports}},
    Option{"decoder-host", "decoder-hosts", 0, true, false, kEngines, "HOST",
           "Multi-turn form: decode hosts, paired with --decoder-port (default: localhost).",
           Binding{.show = &show_decoder_hosts}},
    Option{"decoder-port", "decoder-ports", 0, true, false, kEngines, "PORT",
           "Multi-turn form: decode ports, one per host (default: 8200).",
           Binding{.show = &show_decoder_ports}},
    Option{"encode-servers-urls", "", 0, false, false, kEngines, "URL,URL",
           "EPD form: comma-separated encoder URLs for multimodal items (default: none).",
           Binding{.show = &show_encode_urls}},
    Option{"prefill-servers-urls", "", 0, false, false, kEngines, "URL,URL|disable",
           "EPD form: comma-separated prefill URLs; disable, none or \"\" sends each request "
           "in one hop to a combined P+D instance (default: none).",
           Binding{.show = &show_prefill_urls}},
    Option{"decode-servers-urls", "", 0, false, false, kEngines, "URL,URL",
           "EPD form: comma-separated decode URLs (default: none).",
           Binding{.show = &show_decode_urls}},
    Option{"kv-connector", "", 0, false, false, kEngines, "nixl|mooncake|p2p-nccl|lmcache|none",
           "How prefill hands KV blocks to decode; none sends one hop (default: nixl).",
           checked_text_field<&set_kv_connector, &Config::kv_connector>, kRestart},
    Option{"nixl-transfer-mode", "", 0, false, false, kEngines, "auto|pull|push",
           "NIXL: decode pulls prefill's blocks (pull) or registers and prefill writes them "
           "(push, no remote_block_ids); auto follows prefill's transfer_mode "
           "(default: auto).",
           checked_text_field<&set_nixl_transfer_mode, &Config::nixl_transfer_mode>, kRestart},
    Option{"mooncake-legs", "", 0, false, false, kEngines, "parallel|sequential",
           "Mooncake: both legs at once under a gateway-minted transfer_id (parallel), or "
           "prefill first in the NIXL pull form, as older engines take (default: parallel).",
           checked_text_field<&set_mooncake_legs, &Config::mooncake_legs>, kRestart},
    Option{"mooncake-bootstrap-port", "", 0, false, false, kEngines, "PORT",
           "Mooncake: port of the bootstrap server on each prefill's host "
           "(VLLM_MOONCAKE_BOOTSTRAP_PORT); 0: the prefill's own port (default: 8998).",
           Binding{&set_mooncake_bootstrap_port, &show_number<&Config::mooncake_bootstrap_port>,
                   &copy_field<&Config::mooncake_bootstrap_port>}},
    Option{"kv-lease", "", 0, false, false, kEngines, "DURATION",
           "How long prefills keep their blocks for decode (the engines' "
           "kv_lease_duration); a decode leg later than this re-runs prefill; 0 turns the "
           "check off (default: 30s).",
           duration_field<&Config::kv_lease>},
    Option{"kv-events", "", 0, true, false, kEngines,
           "INSTANCE=tcp://HOST:PORT[,replay=tcp://HOST:PORT]",
           "Where an instance publishes its KV-cache events (vLLM's --kv-events-config "
           "endpoint, and its replay endpoint): pdgate then knows exactly which prefixes it "
           "holds (docs/kv-events.md); repeat the flag for more instances (default: none).",
           Binding{.show = &show_kv_events}, false, true},
    Option{"data-parallel", "", 0, true, false, kEngines, "INSTANCE=RANKS",
           "An engine started with data parallelism (vLLM's --data-parallel-size behind one "
           "API server): pdgate routes to each rank as an instance of its own, pins both "
           "legs with the X-data-parallel-rank header and keeps each rank's KV events, "
           "cache and load apart (docs/protocol.md); repeat the flag for more instances "
           "(default: 1 rank each).",
           Binding{.show = &show_data_parallel}, false, true},
    // The event subscriptions and the exact index are set up once.
    Option{"kv-events-replay-timeout", "", 0, false, false, kEngines, "DURATION",
           "Time a replay of missed KV events may take before the instance falls back to the "
           "approximate index (default: 2s).",
           duration_field<&Config::kv_events_replay_timeout>, kRestart},
    Option{"kv-index-blocks-per-instance", "", 0, false, false, kEngines, "N",
           "KV blocks the exact index keeps per instance; more are dropped and counted "
           "(default: 262144).",
           uint_field<&Config::kv_index_blocks_per_instance, (1u << 30)>, kRestart},
    Option{"kv-index-max-blocks", "", 0, false, false, kEngines, "N",
           "KV blocks the exact index keeps in all (default: 2000000).",
           uint_field<&Config::kv_index_max_blocks, (1u << 31)>, kRestart},

    Option{"max-body-size", "", 0, false, false, kLimits, "SIZE",
           "Largest request body accepted; bytes or K/KiB/M/MiB/G/GiB (default: 64MiB).",
           size_field<&Config::max_body_bytes>},
    Option{"max-header-size", "", 0, false, false, kLimits, "SIZE",
           "Largest request header block accepted (default: 64KiB).",
           size_field<&Config::max_header_bytes>},
    Option{"body-memory-limit", "", 0, false, false, kLimits, "SIZE",
           "Memory all request bodies being received may hold together; past it a large "
           "body is refused with 503 (default: 1GiB).",
           size_field<&Config::body_memory_limit>},
    Option{"header-timeout", "", 0, false, false, kLimits, "DURATION",
           "Time allowed to receive a request's headers; 500ms, 10s, 2m or seconds "
           "(default: 10s).",
           duration_field<&Config::header_timeout>},
    Option{"client-idle-timeout", "", 0, false, false, kLimits, "DURATION",
           "Idle keep-alive client connections are closed after this (default: 75s).",
           duration_field<&Config::client_idle_timeout>},
    Option{"api-keys", "", 0, false, false, kLimits, "FILE",
           "YAML file of client API keys (SHA-256 hashed) with optional limits; clients must "
           "send 'Authorization: Bearer KEY' (default: none, no key asked).",
           trimmed_field<&Config::api_keys_file>, kRestart},
    Option{"api-keys-from-redis", "", 0, false, false, kLimits, "true|false",
           "Also read API keys from the Redis hash PREFIXapi_keys (hex SHA-256 -> JSON), "
           "refreshed every 5s; needs --redis (default: false).",
           switch_field<&Config::api_keys_from_redis>, kRestart},
    Option{"limits-on-redis-failure", "", 0, false, false, kLimits, "open|closed",
           "When Redis cannot answer a limit check: let the request in (open) or answer 503 "
           "(closed) (default: open).",
           Binding{&set_fail_mode, &show_fail_mode, &copy_field<&Config::limits_fail_open>},
           kRestart},

    Option{"connect-timeout", "", 0, false, false, kUpstream, "DURATION",
           "Time allowed to connect to an engine (default: 5s).",
           duration_field<&Config::connect_timeout>},
    Option{"first-byte-timeout", "", 0, false, false, kUpstream, "DURATION",
           "Time allowed for an engine's first response byte, prefill included, and "
           "for each silence inside its response (default: 600s).",
           duration_field<&Config::first_byte_timeout>},
    Option{"upstream-idle-timeout", "", 0, false, false, kUpstream, "DURATION",
           "Idle keep-alive connections to engines are closed after this "
           "(default: 60s).",
           duration_field<&Config::upstream_idle_timeout>, kRestart},
    Option{"upstream-max-idle", "", 0, false, false, kUpstream, "N",
           "Idle keep-alive connections kept per engine per worker (default: 64).",
           uint_field<&Config::upstream_max_idle, (1u << 20)>, kRestart},
    Option{"answer-memory-limit", "", 0, false, false, kUpstream, "SIZE",
           "Memory all whole (non-streamed) engine answers being read may hold together; past "
           "it the request is answered 503 (default: 1GiB).",
           size_field<&Config::answer_memory_limit>},
    Option{"encode-max-items", "", 0, false, false, kUpstream, "N",
           "Media items one chat request may send to the encoders; more are refused with 400 "
           "(default: 1024).",
           uint_field<&Config::encode_max_items, (1u << 20)>},
    Option{"encode-concurrency", "", 0, false, false, kUpstream, "N",
           "Encoder calls one request makes at once; its other items wait (default: 16).",
           uint_field<&Config::encode_concurrency, (1u << 16)>},
    Option{"encode-max-inflight", "", 0, false, false, kUpstream, "N",
           "Encoder calls each worker makes at once for all its requests; more wait, up to "
           "--first-byte-timeout (default: 256).",
           uint_field<&Config::encode_max_inflight, (1u << 20)>, kRestart},
    // The engines' TLS context is made once.
    Option{"upstream-ca", "", 0, false, false, kUpstream, "FILE",
           "PEM CA bundle that https:// engines' certificates must chain to (default: the "
           "system's CA store).",
           trimmed_field<&Config::upstream_ca>, kRestart},
    Option{"upstream-cert", "", 0, false, false, kUpstream, "FILE",
           "PEM client certificate presented to https:// engines (mutual TLS) (default: "
           "none).",
           trimmed_field<&Config::upstream_cert>, kRestart},
    Option{"upstream-key", "", 0, false, false, kUpstream, "FILE",
           "The PEM private key of --upstream-cert (default: none).",
           trimmed_field<&Config::upstream_key>, kRestart},
    Option{"upstream-insecure", "", 0, false, false, kUpstream, "true|false",
           "Do not verify https:// engines' certificates or names; for testing only "
           "(default: false).",
           switch_field<&Config::upstream_insecure>, kRestart},

    Option{"policy", "", 0, false, false, kPolicies, "NAME|PATH",
           "Routing policy for every stage: round_robin, least_load, power_of_two, "
           "session_affinity, prefix_affinity, cache_aware, kv_aware, conversation_decode, "
           "conditional_pd, or a .lua file "
           "(default: round_robin).",
           name_field<&Config::policy>},
    Option{"policy-prefill", "", 0, false, false, kPolicies, "NAME|PATH",
           "Policy for the prefill stage (default: --policy).",
           name_field<&Config::policy_prefill>},
    Option{"policy-decode", "", 0, false, false, kPolicies, "NAME|PATH",
           "Policy for the decode stage (default: --policy).", name_field<&Config::policy_decode>},
    Option{"policy-encode", "", 0, false, false, kPolicies, "NAME|PATH",
           "Policy for the encode stage (default: --policy).", name_field<&Config::policy_encode>},
    Option{"policy-dir", "", 0, false, false, kPolicies, "DIR",
           "Directory searched for NAME.lua before the shipped policies (default: none).",
           name_field<&Config::policy_dir>},
    Option{"policy-budget-us", "", 0, false, false, kPolicies, "N",
           "Time a policy hook may run, in microseconds; past it the request is routed "
           "round-robin (default: 1000).",
           Binding{&set_policy_budget, &show_policy_budget, &copy_field<&Config::policy_budget>}},
    Option{"policy-memory", "", 0, false, false, kPolicies, "SIZE",
           "Memory each worker's policy state may hold (default: 64MiB).",
           size_field<&Config::policy_memory>},
    Option{"prefix-block-size", "", 0, false, false, kPolicies, "SIZE",
           "Prompt bytes per prefix block hash that policies compare (default: 256).",
           size_field<&Config::prefix_block_size>},
    Option{"policy-poll-interval", "", 0, false, false, kPolicies, "DURATION",
           "How often policy files are checked for changes and reloaded (default: 1s).",
           duration_field<&Config::policy_poll_interval>, kRestart},
    Option{"policy-log-level", "", 0, true, false, kPolicies, "NAME=LEVEL",
           "The level of one policy's pdgate.log lines (trace, debug, info, warn or error; "
           "NAME as in metrics: the script's file name without .lua), whatever --log-level "
           "says; repeat the flag for more policies (default: --log-level).",
           Binding{.show = &show_policy_log_levels}, false, true},
    Option{"metrics-interval", "", 0, false, false, kPolicies, "DURATION|off",
           "How often each engine's /metrics is scraped for policies; off disables "
           "(default: 250ms).",
           interval_field<&Config::metrics_interval>, kRestart},
    // Set up once, with the exact index it feeds.
    Option{"tokenizer", "", 0, false, false, kPolicies, "sim|vllm|none",
           "How a request becomes token ids for the exact KV index (pdgate.cached_tokens(), "
           "docs/kv-events.md): sim applies pdgate-sim's rule (tests, demos); vllm asks a decode "
           "engine's POST /tokenize before routing (exact for any model, one round trip); none "
           "gives policies no exact data (default: none).",
           checked_text_field<&set_tokenizer, &Config::tokenizer>, kRestart},
    Option{"tokenizer-timeout", "", 0, false, false, kPolicies, "DURATION",
           "How long --tokenizer vllm waits for /tokenize; past it the request is routed without "
           "exact data (default: 1s).",
           duration_field<&Config::tokenizer_timeout>},

    Option{"dns-interval", "", 0, false, false, kEngines, "DURATION",
           "How often dns://NAME:PORT instance sources are resolved again (default: 5s).",
           duration_field<&Config::dns_interval>, kRestart},
    Option{"dns-server", "", 0, false, false, kEngines, "HOST:PORT",
           "DNS server asked for dns:// sources (default: the first nameserver of "
           "/etc/resolv.conf, port 53).",
           trimmed_field<&Config::dns_server>, kRestart},
    Option{"dns-max-instances", "", 0, false, false, kEngines, "N",
           "Instances one dns:// source may contribute at most, counting addresses still "
           "being checked; further addresses in its answers are ignored (default: 64).",
           count_field<&Config::dns_max_instances>, kRestart},
    Option{"redis", "", 0, false, false, kGeneral, "URL",
           "Conversation store for multi-turn KV reuse shared by replicas: "
           "redis://[:password@]host:port[/db], "
           "redis+sentinel://[:password@]host:port[,host:port...]/master[/db] "
           "or unix:///path; percent-escapes in the user and password are decoded (an @ in "
           "a password is %40) (default: in memory).",
           Binding{&set_trimmed<&Config::redis_url>, &show_redis, &copy_field<&Config::redis_url>},
           kRestart},
    Option{"redis-key-prefix", "", 0, false, false, kGeneral, "PREFIX",
           "Prefix of the Redis keys (default: pdgate:).", text_field<&Config::redis_key_prefix>,
           kRestart},
    Option{"redis-timeout", "", 0, false, false, kGeneral, "DURATION",
           "Longest wait for Redis before a turn proceeds as a cache miss (default: 50ms).",
           duration_field<&Config::redis_timeout>, kRestart},
    // The Redis TLS context is made once, at start.
    Option{"redis-tls-ca", "", 0, false, false, kGeneral, "FILE",
           "PEM CA bundle that rediss:// servers' (and sentinels') certificates must chain to "
           "(default: the system's CA store).",
           trimmed_field<&Config::redis_tls_ca>, kRestart},
    Option{"redis-tls-cert", "", 0, false, false, kGeneral, "FILE",
           "PEM client certificate presented to rediss:// servers (mutual TLS) (default: none).",
           trimmed_field<&Config::redis_tls_cert>, kRestart},
    Option{"redis-tls-key", "", 0, false, false, kGeneral, "FILE",
           "The PEM private key of --redis-tls-cert (default: none).",
           trimmed_field<&Config::redis_tls_key>, kRestart},
    Option{"shared-kv-index", "", 0, false, false, kGeneral, "on|off",
           "With --redis, replicas share where they routed each prompt prefix and "
           "conversation, so prefix and conversation policies see the whole cluster's "
           "routing (default: on).",
           switch_field<&Config::shared_kv_index>, kRestart},
    Option{"load-sync-interval", "", 0, false, false, kGeneral, "DURATION|off",
           "With --redis, each replica shares its load on every engine (requests in "
           "flight, prompt tokens queued) as soon as a request changes it, at most once "
           "per this interval, so all replicas route on the whole cluster's load; off "
           "shares none (default: 1ms).",
           interval_field<&Config::load_sync_interval>, kRestart},
    Option{"load-sync-expiry", "", 0, false, false, kGeneral, "DURATION",
           "How long a replica's shared load counts without a new report: a replica that "
           "died or lost Redis stops counting after this (default: 1s).",
           duration_field<&Config::load_sync_expiry>, kRestart},
    Option{"load-sync-recheck-slot", "", 0, false, false, kGeneral, "DURATION|0",
           "How long a policy's pdgate.RECHECK waits per replica with load ahead of this "
           "one, for their picks to arrive before it asks again; 0 asks again at once "
           "(default: 10ms, at most 50ms).",
           interval_field<&Config::load_sync_recheck_slot>, kRestart},
    Option{"conversation-ttl", "", 0, false, false, kGeneral, "DURATION",
           "How long a conversation's decode blocks stay reusable (default: 450s).",
           duration_field<&Config::conversation_ttl>},
    Option{"conversation-cache-size", "", 0, false, false, kGeneral, "N",
           "Conversations the in-memory store keeps (default: 100000).",
           uint_field<&Config::conversation_cache_size, (1u << 30)>, kRestart},
    Option{"conversation-scope-header", "", 0, false, false, kGeneral, "NAME",
           "Header whose value decides whose conversations a request may continue, e.g. "
           "x-tenant-id (default: the Authorization credential).",
           checked_text_field<&set_scope_header, &Config::conversation_scope_header>},
    Option{"conversation-anonymous-reuse", "", 0, false, false, kGeneral, "true|false",
           "Requests that name no client (no API key, no Authorization, no scope header) share "
           "one scope, guarded by the exact-history check; false gives them no reuse "
           "(default: true).",
           switch_field<&Config::conversation_anonymous_reuse>},
    Option{"token-reserve", "", 0, false, false, kGeneral, "N",
           "Tokens held against an API key's tokens_per_minute for a completion that sets no "
           "max_tokens, until its real count is known (default: 1024).",
           uint_field<&Config::token_reserve, (std::uint64_t{1} << 40)>},
    Option{"expose-kv-params", "", 0, false, false, kGeneral, "true|false",
           "Let clients see decode's kv_transfer_params (default: false).",
           Binding{&set_expose_kv_params, &show_as<&Config::expose_kv_params, &bool_text>,
                   &copy_field<&Config::expose_kv_params>}},
    Option{"verbose-errors", "", 0, false, false, kGeneral, "true|false",
           "Error bodies sent to clients include engine addresses and engines' own error "
           "text; otherwise only the stage that failed and how (default: false).",
           switch_field<&Config::verbose_errors>},
    Option{"profile-routes", "", 0, false, false, kGeneral, "on|off",
           "Serve POST /start_profile and /stop_profile on the client port (they need the "
           "admin key when one is set) (default: on).",
           switch_field<&Config::profile_routes>, kRestart},
    Option{"admin-port", "", 0, false, false, kGeneral, "PORT",
           "Port of the admin API (docs/admin.md); 0 picks a free one (default: off).",
           Binding{&set_admin_port, &show_admin_port, &keep_admin_port}, kRestart},
    Option{"admin-host", "", 0, false, false, kGeneral, "HOST",
           "Address the admin API listens on (default: 127.0.0.1).",
           trimmed_field<&Config::admin_host>, kRestart},
    // Shown as its path, never its content (the key).
    Option{"admin-key-file", "", 0, false, false, kGeneral, "FILE",
           "File holding the admin API key (default: env ADMIN_API_KEY).",
           trimmed_field<&Config::admin_key_file>, kRestart},
    // As the client listener's TLS files: re-read on every reload.
    Option{"admin-tls-cert", "", 0, false, false, kGeneral, "FILE",
           "Serve the admin API over TLS with this PEM certificate (its chain after it); "
           "re-read on SIGHUP (default: none, plain HTTP).",
           trimmed_field<&Config::admin_tls_cert>, kRestart},
    Option{"admin-tls-key", "", 0, false, false, kGeneral, "FILE",
           "The PEM private key of --admin-tls-cert; re-read on SIGHUP (default: none).",
           trimmed_field<&Config::admin_tls_key>, kRestart},
    Option{"admin-tls-client-ca", "", 0, false, false, kGeneral, "FILE",
           "Require admin clients' certificates signed by a CA in this PEM file (mutual TLS); "
           "re-read on SIGHUP (default: none, no client certificate asked).",
           trimmed_field<&Config::admin_tls_client_ca>, kRestart},
    Option{"model-check-timeout", "", 0, false, false, kGeneral, "DURATION",
           "Time an instance added at run time has to answer GET /v1/models when --model "
           "is set, and to resolve for --allowed-upstreams (default: 5s).",
           duration_field<&Config::model_check_timeout>, kRestart},
    Option{"shutdown-timeout", "", 0, false, false, kGeneral, "DURATION",
           "On SIGTERM or SIGINT, time in-flight requests have to finish before pdgate "
           "exits anyway (default: 30s).",
           duration_field<&Config::shutdown_timeout>, kRestart},
    Option{"allowed-upstreams", "", 0, true, false, kGeneral, "CIDR",
           "Networks instances added at run time (admin API, Redis, addresses found through "
           "dns:// sources) must be in, e.g. 10.0.0.0/8; instances on the command line or in "
           "the config file are trusted (default: any).",
           list_field<&Config::allowed_upstreams>, kRestart},
    Option{"health-interval", "", 0, false, false, kGeneral, "DURATION|off",
           "How often each instance's /health is checked (default: 2s).",
           interval_field<&Config::health_interval>, kRestart},
    Option{"health-rise", "", 0, false, false, kGeneral, "N",
           "Passed checks that re-admit an ejected instance (default: 2).",
           count_field<&Config::health_rise>, kRestart},
    Option{"health-fall", "", 0, false, false, kGeneral, "N",
           "Failed checks that eject an instance (default: 2).", count_field<&Config::health_fall>,
           kRestart},
    Option{"health-max-concurrency", "", 0, false, false, kGeneral, "N",
           "Health checks in flight at most, spread over the interval; also bounds the "
           "/metrics scrapes and the validation of instances learnt through Redis "
           "(default: 64).",
           count_field<&Config::health_max_concurrency>, kRestart},
    Option{"eject-after", "", 0, false, false, kGeneral, "N",
           "Consecutive request failures (connect, timeout, 5xx) that eject an instance "
           "(default: 3).",
           count_field<&Config::eject_after>},
    Option{"decode-migrations", "", 0, false, false, kGeneral, "N",
           "Times one stream may be resumed on another decode after its decode broke off "
           "mid-answer (reset, error event, silence past --first-byte-timeout), 0 to 8; 0 "
           "ends such a stream with an error event (default: 1).",
           uint_field<&Config::decode_migrations, 8>},
    Option{"resume-token-ids", "", 0, false, false, kGeneral, "true|false",
           "Resumable streams ask the engines for token ids (vLLM 0.10.2's return_token_ids; "
           "older engines ignore it), cut from what clients that did not ask are sent, so a "
           "stream resumed on another decode goes on token-exact (default: false).",
           switch_field<&Config::resume_token_ids>},
    Option{"retry-budget", "", 0, false, false, kGeneral, "FRACTION",
           "Retries in flight allowed, as a fraction of requests in flight (default: 0.2).",
           fraction_field<&Config::retry_budget>},
    // The span exporter is started once.
    Option{"otlp-endpoint", "", 0, false, false, kTracing, "URL",
           "Where spans are exported over OTLP/HTTP (JSON), e.g. http://collector:4318 "
           "(path default /v1/traces; https:// for TLS) (default: none, no spans).",
           checked_text_field<&set_otlp_endpoint, &Config::otlp_endpoint>, kRestart},
    Option{"otlp-ca", "", 0, false, false, kTracing, "FILE",
           "PEM CA bundle that an https:// --otlp-endpoint's certificate must chain to "
           "(default: the system's CA store).",
           trimmed_field<&Config::otlp_ca>, kRestart},
    Option{"trace-sample-ratio", "", 0, false, false, kTracing, "FRACTION",
           "Fraction of the traces pdgate starts that are sampled; a client's traceparent "
           "decides its own (default: 1).",
           fraction_field<&Config::trace_sample_ratio>},
    Option{"otlp-batch-size", "", 0, false, false, kTracing, "N",
           "Spans per export request at most (default: 512).",
           uint_field<&Config::otlp_batch_size, 100000>, kRestart},
    Option{"otlp-export-interval", "", 0, false, false, kTracing, "DURATION",
           "Longest time a finished span waits before it is exported (default: 1s).",
           duration_field<&Config::otlp_export_interval>, kRestart},
    Option{"otlp-queue-size", "", 0, false, false, kTracing, "N",
           "Finished spans waiting for export at most; more are dropped and counted in "
           "pdgate_trace_spans_dropped_total (default: 8192).",
           uint_field<&Config::otlp_queue_size, (1u << 24)>, kRestart},
    Option{"otlp-timeout", "", 0, false, false, kTracing, "DURATION",
           "Time one export request may take, connecting included (default: 5s).",
           duration_field<&Config::otlp_timeout>, kRestart},
    Option{"forward-headers", "", 0, true, false, kTracing, "NAME,NAME",
           "Client request headers passed on to the engines when present, e.g. "
           "x-tenant-id,x-priority (default: none).",
           list_field<&Config::forward_headers>},
    Option{"set-header", "", 0, true, false, kTracing, "'NAME: VALUE'",
           "A header every engine request carries; repeat the flag for more (default: none).",
           Binding{.show = &show_set_headers}, false, true},
    Option{"log-level", "", 0, false, false, kGeneral, "LEVEL",
           "trace, debug, info, warn or error (default: info).",
           checked_text_field<&set_log_level, &Config::log_level>},
    // The access log is opened once, when the listener binds.
    Option{"access-log", "", 0, false, false, kGeneral, "PATH|stderr|off",
           "One line per completion request (status, instances, TTFT, tokens, ...) appended to "
           "PATH, or "
           "written to stderr; written by a background thread, lines dropped and counted "
           "when it cannot keep up (default: off).",
           checked_text_field<&set_access_log, &Config::access_log>, kRestart},
    Option{"access-log-format", "", 0, false, false, kGeneral, "text|json",
           "Access log lines as key=value text or as one JSON object each (default: text).",
           checked_text_field<&set_access_log_format, &Config::access_log_format>, kRestart},
    Option{"config", "", 0, false, true, kGeneral, "FILE",
           "YAML file with any of these options (names without dashes); flags override it. "
           "SIGHUP re-reads it and applies what can change without a restart."},
    Option{"help", "", 'h', false, true, kGeneral, "", "Print this help and exit."},
    Option{"version", "", 'V', false, true, kGeneral, "", "Print the version and exit."},
    Option{"check-config", "", 0, false, true, kGeneral, "",
           "Check the flags, the --config file and the policy scripts, then exit: 0 when "
           "valid, 1 with every error otherwise (nothing is resolved or contacted)."},
};

}  // namespace

std::span<const Option> options() {
  return kOptions;
}

const Option* find_option(std::string_view name) {
  const std::string n = normalize_name(name);
  for (const auto& o : kOptions) {
    if (o.key == n || (!o.alias.empty() && o.alias == n))
      return &o;
  }
  return nullptr;
}

const Option* find_short(char c) {
  for (const auto& o : kOptions) {
    if (o.short_name != 0 && o.short_name == c)
      return &o;
  }
  return nullptr;
}

}  // namespace pdgate::config_detail

namespace pdgate {

std::string help_text() {
  std::string out =
      "usage: pdgate [--config FILE] [--host HOST] [--port PORT] [options]\n"
      "              (--decode HOST:PORT ... | --decoder-host HOST ... --decoder-port PORT ...\n"
      "               | --decode-servers-urls URL,URL) [prefill instances]\n"
      "\n"
      "A gateway for disaggregated prefill/decode vLLM serving. It accepts the command\n"
      "lines of vLLM's proxies: disagg_proxy_demo.py (--model, --prefill, --decode),\n"
      "disagg_proxy_multiturn.py (--prefiller-host/--prefiller-port, --decoder-host/\n"
      "--decoder-port) and disagg_epd_proxy.py (--*-servers-urls). Instances are host:port\n"
      "or http://host:port. Every option can also be set in the --config YAML file under\n"
      "its name without dashes ('-' or '_'); flags override the file.\n";
  constexpr std::string_view groups[] = {config_detail::kListener, config_detail::kEngines,
                                         config_detail::kLimits,   config_detail::kUpstream,
                                         config_detail::kPolicies, config_detail::kTracing,
                                         config_detail::kGeneral};
  for (const auto group : groups) {
    out += "\n";
    out += group;
    out += ":\n";
    for (const auto& o : config_detail::options()) {
      if (o.group != group)
        continue;
      std::string left = "  --" + std::string(o.key);
      if (!o.alias.empty())
        left += ", --" + std::string(o.alias);
      if (o.short_name != 0)
        left += std::string(", -") + o.short_name;
      if (!o.metavar.empty())
        left += " " + std::string(o.metavar) + (o.list ? " ..." : "");
      out += left;
      constexpr std::size_t kColumn = 40;
      if (left.size() + 2 > kColumn) {
        out += "\n" + std::string(kColumn, ' ');
      } else {
        out += std::string(kColumn - left.size(), ' ');
      }
      out += o.help;
      out += "\n";
    }
  }
  return out;
}

}  // namespace pdgate
