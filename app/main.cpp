// pdgate: an OpenAI-compatible gateway for disaggregated (prefill/decode)
// vLLM serving. See README.md.
#include <malloc.h>
#ifdef PDGATE_WITH_MIMALLOC
#include <mimalloc.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>

#include <luajit.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/version.hpp>

#include "core/gateway/access_log.hpp"
#include "core/gateway/config_reload.hpp"
#include "core/gateway/control_loop.hpp"
#include "core/gateway/server.hpp"
#include "core/net/tls_context.hpp"
#include "core/routing/kv_block_index.hpp"
#include "core/upstream/instance_address.hpp"
#include "core/upstream/kv_event_follow.hpp"
#include "plugins/conversation_stores.hpp"
#include "plugins/dns_discovery.hpp"
#include "plugins/kv_connectors.hpp"
#include "plugins/otlp_exporter.hpp"
#include "plugins/redis_client_context.hpp"
#include "plugins/redis_client_keys.hpp"
#include "plugins/redis_connection.hpp"
#include "plugins/redis_kv_index.hpp"
#include "plugins/redis_load_sync.hpp"
#include "plugins/redis_rate_limits.hpp"
#include "plugins/shared_registry.hpp"
#include "plugins/sim_tokenizer.hpp"
#include "plugins/zmq_kv_events.hpp"
#include "policies/engine.hpp"
#include "policies/kv_index_purge.hpp"
#include "policies/local_kv_index.hpp"
#include "policies/metrics.hpp"

// The allocator's return of freed memory to the kernel, tuned so that a
// large request body freed and allocated again by the next request does
// not page-fault and zero-fill all over again (on a VM a page fault costs
// microseconds: a quarter of a 1 MiB prompt's CPU with glibc's defaults,
// seven eighths with mimalloc's).
//
// mimalloc (the default build, cmake/PdgateDeps.cmake) decommits freed
// pages 25 ms after they are freed: 1 MiB prompts one at a time took
// 13-20 ms of gateway CPU each instead of 1.3-1.6 ms. Freed memory is kept
// for 500 ms instead; a MIMALLOC_DECOMMIT_DELAY in the environment wins.
//
// glibc (-DPDGATE_MIMALLOC=OFF) returns a freed 1 MiB body at once (a
// worker thread's arena shrinks when 2 MiB are free at its top): bodies up
// to 8 MiB come from the heap and up to 32 MiB of free top is kept per
// arena (one per worker); larger bodies still get their own mappings.
void tune_malloc() {
#ifdef PDGATE_WITH_MIMALLOC
  if (std::getenv("MIMALLOC_DECOMMIT_DELAY") == nullptr)
    mi_option_set(mi_option_decommit_delay, 500);
#else
  mallopt(M_MMAP_THRESHOLD, 8 << 20);
  mallopt(M_TRIM_THRESHOLD, 32 << 20);
#endif
}

// Whether the engines' TLS context is made at start: a TLS file is named,
// or an engine given at start is https://. Otherwise it waits for the
// first https:// engine (added through the admin API, Redis or DNS).
bool wants_engine_tls(const pdgate::Config& c) {
  if (!c.upstream_ca.empty() || !c.upstream_cert.empty())
    return true;
  for (const auto* list : {&c.prefill, &c.decode, &c.encode}) {
    for (const auto& spec : *list) {
      if (spec.tls)
        return true;
    }
  }
  return false;
}

// Whether Redis connections need a TLS context: a rediss:// URL, or a
// --redis-tls-* file named (loaded, and so checked, even then).
bool wants_redis_tls(const pdgate::Config& c) {
  if (!c.redis_tls_ca.empty() || !c.redis_tls_cert.empty())
    return true;
  if (c.redis_url.empty())
    return false;
  auto ep = pdgate::parse_redis_url(c.redis_url);
  return ep && ep->tls;
}

// The connections to Redis of each part of pdgate that has some, counted
// apart for /metrics (pdgate_redis_*{role}), all with one TLS context.
class RedisClients {
 public:
  explicit RedisClients(const pdgate::Config& c)
      : tls_(wants_redis_tls(c)
                 ? std::make_shared<const pdgate::EngineTls>(pdgate::EngineTlsOptions::redis(c))
                 : nullptr) {}
  // The context of one part, `role` naming it on /metrics.
  pdgate::RedisClientContext context(std::string_view role) {
    auto stats = std::make_shared<pdgate::RedisConnectionStats>();
    rows_.push_back({role, stats});
    return {tls_, std::move(stats)};
  }
  // Loads the TLS files now: one that does not load stops the start.
  std::string make_now() const { return tls_ ? tls_->make_now() : std::string(); }
  void write_metrics(pdgate::PrometheusText& m) const {
    std::vector<pdgate::RedisStatsRow> rows;
    rows.reserve(rows_.size());
    for (const auto& [role, stats] : rows_)
      rows.push_back({role, stats.get()});
    pdgate::write_redis_metrics(m, rows);
  }

 private:
  std::shared_ptr<const pdgate::EngineTls> tls_;
  std::vector<std::pair<std::string_view, std::shared_ptr<pdgate::RedisConnectionStats>>> rows_;
};

// The files a start loads after the configuration is read, loaded (and
// for the access log, probed) as the start would: the listener's
// certificate, key and client CA, the engines' CA and client certificate,
// the access log, the OTLP exporter's settings. Each problem is appended.
void check_files(const pdgate::Config& cfg, std::vector<std::string>& errors) {
  if (auto tls = pdgate::make_listener_tls(cfg); !tls)
    errors.push_back(tls.error());
  if (auto tls = pdgate::make_admin_tls(cfg); !tls)
    errors.push_back(tls.error());
  if (wants_redis_tls(cfg)) {
    const pdgate::EngineTls redis_tls(pdgate::EngineTlsOptions::redis(cfg));
    if (auto err = redis_tls.make_now(); !err.empty())
      errors.push_back(err);
  }
  if (wants_engine_tls(cfg)) {
    const pdgate::EngineTls engine_tls(pdgate::EngineTlsOptions::from(cfg));
    if (auto err = engine_tls.make_now(); !err.empty())
      errors.push_back(err);
  }
  if (cfg.access_log != "off") {
    if (auto problem = pdgate::AccessLog::problem(cfg.access_log))
      errors.push_back(*problem);
  }
  if (!cfg.otlp_endpoint.empty()) {
    if (auto options = pdgate::otlp_options(cfg, PDGATE_VERSION); !options)
      errors.push_back(options.error());
  }
}

int main(int argc, char** argv) {
  tune_malloc();
  // Every mistake is collected, a line each, as compilers list them:
  // --check-config (as nginx -t) reports them all in one run, flags and
  // files alike.
  std::vector<std::string> errors;
  pdgate::CommandLine parsed = pdgate::read_command_line(argc, argv, errors);
  const auto report = [&errors] {
    for (const auto& e : errors) {
      std::string_view rest = e;
      while (!rest.empty()) {
        const auto line = rest.substr(0, rest.find('\n'));
        std::fprintf(stderr, "pdgate: %.*s\n", static_cast<int>(line.size()), line.data());
        rest.remove_prefix(std::min(line.size() + 1, rest.size()));
      }
    }
  };
  if (parsed.help) {
    std::fputs(pdgate::help_text().c_str(), stdout);
    return 0;
  }
  if (parsed.version && errors.empty()) {
    std::printf("pdgate %s (Boost %d.%d, %s)\n", PDGATE_VERSION, BOOST_VERSION / 100000,
                BOOST_VERSION / 100 % 1000, LUAJIT_VERSION);
    return 0;
  }
  // --check-config reports an invalid configuration with 1 (as nginx -t
  // does); starting with one is a usage error, 2. A start with mistakes in
  // its flags stops here; a check goes on to the files they name.
  if (!errors.empty() && !parsed.check_only) {
    report();
    std::fputs("Try 'pdgate --help'.\n", stderr);
    return 2;
  }
  const int config_error = parsed.check_only ? 1 : 2;
  const pdgate::Config& cfg = parsed.config;
  // Logs go to stderr; stdout carries only the "listening" line, which
  // scripts and tests read to learn the port.
  spdlog::set_default_logger(spdlog::stderr_color_mt("pdgate"));
  spdlog::set_level(spdlog::level::from_str(cfg.log_level));

  pdgate::ConversationStoreOptions store_options;
  store_options.redis_url = cfg.redis_url;
  store_options.key_prefix = cfg.redis_key_prefix;
  store_options.redis_timeout = cfg.redis_timeout;
  store_options.memory_capacity = cfg.conversation_cache_size;
  // Alive as long as the parts it serves: the /metrics hook holds it.
  auto redis = std::make_shared<RedisClients>(cfg);
  auto stores = pdgate::make_conversation_stores(
      store_options,
      cfg.redis_url.empty() ? pdgate::RedisClientContext{} : redis->context("conversations"));
  if (!stores)
    errors.push_back(stores.error());

  // Where prompt prefixes and conversations were routed, for the policies:
  // with --redis (unless --shared-kv-index off) shared by every replica.
  auto local_index = std::make_shared<pdgate::policy::LocalKvIndex>();
  std::shared_ptr<pdgate::KvLocationIndex> kv_index = local_index;
  std::shared_ptr<pdgate::RedisKvIndex> shared_index;
  if (!cfg.redis_url.empty() && cfg.shared_kv_index) {
    pdgate::RedisKvIndexSettings s;
    s.redis_url = cfg.redis_url;
    s.stream_key = cfg.redis_key_prefix + "kv-index";
    s.ttl_ms = local_index->prefix_ttl_ms();
    s.redis = redis->context("kv_index");
    shared_index = std::make_shared<pdgate::RedisKvIndex>(local_index, std::move(s));
    kv_index = shared_index;
  }

  // Which blocks each engine holds, exactly, from the engines' own KV events
  // (docs/kv-events.md); fed by a thread of its own once the gateway runs.
  auto block_index = std::make_shared<pdgate::KvBlockIndex>(
      pdgate::KvBlockIndexLimits{cfg.kv_index_blocks_per_instance, cfg.kv_index_max_blocks});

  // A broken policy at start-up is a configuration error, reported like one.
  auto policies =
      pdgate::policy::PolicyEngine::create(pdgate::policy::settings_from(cfg), kv_index);
  if (!policies)
    errors.push_back(policies.error());

  // dns:// instance sources need a DNS server to ask (not resolved here:
  // --check-config resolves nothing).
  std::pair<std::string, std::uint16_t> dns_server;
  if (!cfg.dns_sources.empty()) {
    if (auto server = pdgate::DnsDiscovery::server_from(cfg); !server)
      errors.push_back(server.error());
    else
      dns_server = *server;
  }

  // API keys from a file: read once here, before anything serves; a bad
  // file is a configuration error (and --check-config reports it).
  pdgate::KeyTable file_keys;
  if (!cfg.api_keys_file.empty()) {
    if (auto table = pdgate::read_key_file(cfg.api_keys_file); !table)
      errors.push_back(table.error());
    else
      file_keys = std::move(*table);
  }
  // The files the start loads later, loaded now as it would: a check that
  // passes is a start that gets past them.
  check_files(cfg, errors);
  if (!errors.empty()) {
    report();
    return config_error;
  }
  const auto engine = *policies;
  if (cfg.tokenizer == "sim")
    engine->set_exact_kv(block_index, std::make_shared<pdgate::SimTokenizer>());
  else
    engine->set_exact_kv(block_index, nullptr);

  const auto policy_of = [&cfg](const std::string& stage_policy) {
    return stage_policy.empty() ? cfg.policy : stage_policy;
  };
  if (parsed.check_only) {
    // Everything that can be checked without the network has been: the
    // flags, the file, the policy scripts (loaded and self-checked) and
    // every file the configuration names. dns:// sources are resolved
    // only when pdgate runs: they are named, not counted.
    std::string dns;
    for (const auto& d : cfg.dns_sources)
      dns += (dns.empty() ? "; resolved at start: " : ", ") + d.text() + " (" +
             pdgate::to_string(d.role) + ")";
    std::printf(
        "pdgate: configuration OK: %zu prefill, %zu decode, %zu encode instance(s)%s; connector "
        "%s; policies prefill=%s decode=%s encode=%s\n",
        cfg.prefill.size(), cfg.decode.size(), cfg.encode.size(), dns.c_str(),
        cfg.kv_connector.c_str(), policy_of(cfg.policy_prefill).c_str(),
        policy_of(cfg.policy_decode).c_str(), policy_of(cfg.policy_encode).c_str());
    return 0;
  }

  // Instances listed twice under different names (localhost and
  // 127.0.0.1): resolved before anything serves, on a loop of their own.
  {
    boost::asio::io_context resolving{1};
    std::vector<std::string> dups;
    boost::asio::co_spawn(
        resolving,
        [&]() -> boost::asio::awaitable<void> {
          dups = co_await pdgate::resolved_duplicates(
              resolving.get_executor(), cfg,
              std::chrono::steady_clock::now() + cfg.model_check_timeout);
        },
        boost::asio::detached);
    resolving.run();
    if (!dups.empty()) {
      for (const auto& d : dups)
        std::fprintf(stderr, "pdgate: %s\n", d.c_str());
      return 2;
    }
  }

  // The control thread (this one, once the gateway runs): signals, policy
  // reloads (their file reads and script checks never stall a worker) and
  // the engines' metrics scrapes.
  boost::asio::io_context control{1};
  if (auto err = redis->make_now(); !err.empty()) {
    spdlog::critical("{}", err);
    return 2;
  }
  pdgate::policy::start_policy_file_watch(control, engine, cfg.policy_poll_interval);
  if (shared_index) {
    // The URL was checked with the conversation store's; Redis being
    // unreachable is not an error (the index retries in the background).
    if (auto started = shared_index->start(); !started)
      spdlog::error("shared kv index not started: {}", started.error());
  }

  int rc = 0;
  {
    // --kv-connector was validated: it names one of the shipped connectors.
    const pdgate::KvConnectorOptions connector_options{
        .nixl_mode = cfg.nixl_transfer_mode == "push"   ? pdgate::NixlTransferMode::push
                     : cfg.nixl_transfer_mode == "pull" ? pdgate::NixlTransferMode::pull
                                                        : pdgate::NixlTransferMode::automatic,
        .mooncake_parallel = cfg.mooncake_legs != "sequential"};
    std::shared_ptr<const pdgate::KvConnector> connector =
        pdgate::make_kv_connector(cfg.kv_connector, connector_options);
    // How https:// engines are reached: every engine connection, probe
    // and scrape shares this context (core/net/tls_context.hpp).
    // Made at start when it will be needed (a file that does not load
    // stops the start), else when an https:// engine is first added.
    auto engine_tls =
        std::make_shared<const pdgate::EngineTls>(pdgate::EngineTlsOptions::from(cfg));
    if (wants_engine_tls(cfg)) {
      if (auto err = engine_tls->make_now(); !err.empty()) {
        spdlog::critical("{}", err);
        return 2;
      }
    }
    if (cfg.upstream_insecure) {
      spdlog::warn(
          "--upstream-insecure: https:// engines' certificates and names are NOT verified; "
          "anyone on the path can read and alter engine traffic");
    }
    // With --redis, replicas share their instance registry.
    const pdgate::RedisClientContext registry_redis =
        cfg.redis_url.empty() ? pdgate::RedisClientContext{} : redis->context("registry");
    auto share_registry =
        [engine_tls, registry_redis](
            const pdgate::Config& c, pdgate::Registry& registry,
            const pdgate::LoopGuard& loop_guard) -> std::unique_ptr<pdgate::RegistrySync> {
      if (c.redis_url.empty())
        return nullptr;
      return std::make_unique<pdgate::SharedRegistry>(c, registry, loop_guard, engine_tls,
                                                      registry_redis);
    };
    // Spans are exported on the exporter's own thread; it outlives the
    // workers that hand it spans (the gateway keeps a reference).
    std::shared_ptr<pdgate::OtlpExporter> exporter;
    if (!cfg.otlp_endpoint.empty()) {
      auto options = pdgate::otlp_options(cfg, PDGATE_VERSION);
      if (!options) {
        spdlog::critical("{}", options.error());
        return 2;
      }
      exporter = std::make_shared<pdgate::OtlpExporter>(std::move(*options));
    }
    // With --redis, instance ids are the cluster's: those of the configured
    // engines are asked before the registry lists them (bounded).
    pdgate::ClusterIds config_ids;
    if (!cfg.redis_url.empty())
      config_ids = pdgate::SharedRegistry::config_ids(cfg, registry_redis);
    pdgate::Gateway gateway(cfg, std::move(*stores), std::move(connector), engine->factory(),
                            share_registry, config_ids);
    gateway.set_span_sink(exporter);
#ifdef PDGATE_WITH_MIMALLOC
    // mimalloc returns freed pages only when the thread frees more, after
    // the delay tune_malloc() sets: without this, a worker that went quiet
    // after a burst (10,000 streams opened, then held) kept up to ~20 MiB
    // of freed pages committed.
    gateway.set_allocator_trim([] { mi_collect(false); });
#elif !defined(PDGATE_SANITIZED)
    // glibc keeps up to M_TRIM_THRESHOLD free at each arena's top and
    // nothing returns the free pages below it: a burst of connections that
    // closed (each TLS one held ~90 KiB) stayed resident. Trimmed once per
    // lull, as mimalloc is above.
    gateway.set_allocator_trim([] { malloc_trim(0); });
#endif
    gateway.set_engine_tls(engine_tls);
    if (!cfg.api_keys_file.empty() || cfg.api_keys_from_redis) {
      // With --redis the limits hold across every replica; without, each
      // replica enforces them on its own share.
      std::unique_ptr<pdgate::ClientKeys> keys;
      if (cfg.redis_url.empty()) {
        keys = pdgate::make_local_client_keys(std::move(file_keys));
      } else {
        pdgate::RedisClientKeysOptions o;
        o.redis_url = cfg.redis_url;
        o.key_prefix = cfg.redis_key_prefix;
        o.timeout = cfg.redis_timeout;
        o.keys_from_redis = cfg.api_keys_from_redis;
        o.fail_open = cfg.limits_fail_open;
        o.redis = redis->context("client_keys");
        auto made = pdgate::make_redis_client_keys(std::move(file_keys), std::move(o));
        if (!made) {
          std::fprintf(stderr, "pdgate: %s\n", made.error().c_str());
          return 2;
        }
        keys = std::move(*made);
      }
      gateway.set_client_keys(std::move(keys), control.get_executor());
    }
    // The limits policies declare (req:rate_limit): with --redis judged on
    // Redis for every replica, this replica's store standing in when Redis
    // does not answer; without, this replica's store alone.
    {
      pdgate::LocalRateCheck local = [engine](std::span<const pdgate::RateLimitDecl> limits,
                                              bool count) {
        return pdgate::policy::check_rate_limits(engine->kv(), limits, count);
      };
      std::unique_ptr<pdgate::RateLimits> limits;
      if (cfg.redis_url.empty()) {
        limits = pdgate::make_local_rate_limits(std::move(local));
      } else {
        pdgate::RedisRateLimitsOptions o;
        o.redis_url = cfg.redis_url;
        o.key_prefix = cfg.redis_key_prefix;
        o.timeout = cfg.redis_timeout;
        o.redis = redis->context("rate_limits");
        auto made = pdgate::make_redis_rate_limits(std::move(o), std::move(local));
        if (!made) {
          std::fprintf(stderr, "pdgate: %s\n", made.error().c_str());
          return 2;
        }
        limits = std::move(*made);
      }
      gateway.set_rate_limits(std::move(limits));
    }
    // Shared with the /metrics hook; runs on the control loop.
    std::shared_ptr<pdgate::DnsDiscovery> discovery;
    if (!cfg.dns_sources.empty()) {
      auto made = pdgate::DnsDiscovery::create(cfg, gateway.registry(), gateway.loop_guard(),
                                               dns_server.first, dns_server.second);
      if (!made) {
        spdlog::critical("{}", made.error());
        return 2;
      }
      discovery = std::move(*made);
      discovery->start(control.get_executor());
    }
    // Engine load (running, waiting, KV-cache usage) for policies, scraped
    // off the workers' loops on the control thread.
    if (cfg.metrics_interval.count() > 0) {
      pdgate::policy::start_metrics_scraper(control, gateway.registry(), cfg.metrics_interval,
                                            cfg.health_max_concurrency, engine_tls);
    }
    // With --redis, every replica's load on each engine reaches the others
    // within milliseconds (plugins/redis_load_sync.hpp), on a thread of
    // its own.
    std::shared_ptr<pdgate::RedisLoadSync> load_sync;
    if (!cfg.redis_url.empty() && cfg.load_sync_interval.count() > 0) {
      pdgate::RedisLoadSyncSettings s;
      s.redis_url = cfg.redis_url;
      s.channel = cfg.redis_key_prefix + "load";
      s.interval = cfg.load_sync_interval;
      s.expiry = cfg.load_sync_expiry;
      s.heartbeat = std::min(std::chrono::milliseconds(250), cfg.load_sync_expiry / 4);
      s.redis = redis->context("load_sync");
      load_sync = std::make_shared<pdgate::RedisLoadSync>(gateway.registry(), std::move(s));
      if (auto started = load_sync->start(); !started)
        spdlog::error("load sharing not started: {}", started.error());
    }
    pdgate::policy::start_kv_index_purge(control, gateway.registry(), kv_index,
                                         std::chrono::seconds(1));
    // Instances with an event endpoint, at start or added later, are
    // subscribed on the ingestion thread.
    pdgate::ZmqKvEventsOptions event_options;
    event_options.replay_timeout = cfg.kv_events_replay_timeout;
    auto events = std::make_shared<pdgate::ZmqKvEvents>(block_index, event_options);
    events->start();
    pdgate::start_kv_event_follow(control, gateway.registry(), events, std::chrono::seconds(1));
    gateway.set_policy_kv([engine](const std::string& prefix, std::size_t limit) {
      return engine->kv_listing(prefix, limit);
    });
    gateway.set_policy_status([engine] { return engine->status_json(); });
    gateway.set_policy_explainer(
        [engine](const pdgate::InstanceSet& set) { return engine->make_dry_picker(set); });
    gateway.set_policy_hooks(
        [engine]() { return engine->reload(engine->settings(), "admin"); },
        [engine, shared_index, events, discovery, load_sync, redis](pdgate::PrometheusText& m) {
          const auto& st = engine->stats();
          const std::pair<const char*, std::uint64_t> rows[] = {
              {"error", st.errors.load()},
              {"invalid", st.invalid.load()},
              {"budget_exceeded", st.budget_exceeded.load()},
              {"on_complete_error", st.on_complete_errors.load()},
              {"reload_failure", st.reload_failures.load()},
          };
          m.counter("pdgate_policy_errors_total",
                    "Policy failures by kind: the request was routed round-robin (or as "
                    "configured, for on_request), or refused with 503 when the policy is "
                    "fail-closed. A deliberate nil or refusal is no failure "
                    "(pdgate_policy_calls_total, outcome declined or rejected).");
          for (const auto& [kind, n] : rows)
            m.sample("pdgate_policy_errors_total", {{"kind", kind}}, n);
          m.counter("pdgate_policy_picks_total", "Policy picks.");
          m.sample("pdgate_policy_picks_total", std::uint64_t{st.picks.load()});
          engine->policy_metrics().write(m);
          engine->write_reload_metrics(m);
          if (shared_index)
            pdgate::write_kv_index_metrics(m, shared_index->stats());
          if (load_sync)
            pdgate::write_load_sync_metrics(m, load_sync->stats());
          events->write_metrics(m);
          if (discovery)
            discovery->write_metrics(m);
          redis->write_metrics(m);
        });
    // SIGHUP re-reads the command line and its config file and applies
    // what can change at run time (core/gateway/config_reload.hpp).
    pdgate::ConfigReloader reloader(
        control.get_executor(), cfg,
        {[argc, argv]() -> pdgate::Result<pdgate::Config> {
           auto again = pdgate::parse_command_line(argc, argv);
           if (!again)
             return pdgate::fail(again.error());
           return std::move(again->config);
         },
         [engine](const pdgate::Config& next) {
           return engine->reload(pdgate::policy::settings_from(next), "signal");
         },
         [&gateway] { return gateway.prepare_tls_reload(); },
         [&gateway, &cfg]() -> pdgate::Result<std::function<void()>> {
           // The --api-keys file, re-read whole: a file that does not
           // parse refuses the reload and the keys in force stay.
           pdgate::ClientKeys* keys = gateway.client_keys();
           if (keys == nullptr || cfg.api_keys_file.empty())
             return std::function<void()>();
           auto table = pdgate::read_key_file(cfg.api_keys_file);
           if (!table)
             return pdgate::fail(table.error());
           return std::function<void()>(
               [keys, path = cfg.api_keys_file, next = std::move(*table)]() mutable {
                 const auto c = keys->replace_file_keys(std::move(next));
                 spdlog::info("SIGHUP: API keys re-read from {}: {} added, {} removed, {} changed",
                              path, c.added, c.removed, c.changed);
               });
         },
         [&gateway](const pdgate::Config& next) {
           return pdgate::cluster_ids_for(gateway.registry(), next);
         },
         [&gateway](const pdgate::Config& before, std::shared_ptr<const pdgate::Config> next,
                    std::vector<std::string> restart_needed, const pdgate::ClusterIds& ids) {
           gateway.apply_config(before, std::move(next), std::move(restart_needed), ids);
         },
         [&gateway](const std::string& why) { gateway.reload_refused(why); }});
    // Signals are installed before the listener opens: the first
    // signal_set opens a pipe, which must not compete with accepted
    // connections for descriptors (out of them, it threw and ended the
    // process), and a SIGTERM right after "listening" must drain.
    pdgate::ControlLoop signals(
        control,
        {[&gateway] { gateway.begin_drain(); }, [&gateway] { return gateway.in_flight(); },
         [&gateway, &control] {
           gateway.stop();
           control.stop();
         },
         [&reloader] { reloader.reload(); }, [&gateway] { gateway.reopen_logs(); }},
        cfg.shutdown_timeout);
    auto port = gateway.bind();
    if (!port) {
      spdlog::critical("{}", port.error());
      rc = 1;
    } else {
      std::printf("pdgate listening on %s://%s:%u\n", gateway.tls() ? "https" : "http",
                  cfg.host.c_str(), static_cast<unsigned>(*port));
      if (cfg.admin_enabled) {
        std::printf("pdgate admin listening on %s://%s:%u\n",
                    gateway.admin_tls() ? "https" : "http", cfg.admin_host.c_str(),
                    static_cast<unsigned>(gateway.admin_port()));
      }
      std::fflush(stdout);
      spdlog::info(
          "{} prefill, {} decode, {} encode instance(s); connector {}{}; policies prefill={} "
          "decode={} encode={}",
          cfg.prefill.size(), cfg.decode.size(), cfg.encode.size(), cfg.kv_connector,
          cfg.prefill_disabled ? " (prefill disabled: one hop to P+D)" : "",
          policy_of(cfg.policy_prefill), policy_of(cfg.policy_decode),
          policy_of(cfg.policy_encode));
      if (cfg.kv_connector != "none") {
        spdlog::info("multi-turn reuse scope: {}; anonymous clients {}",
                     cfg.conversation_scope_header.empty()
                         ? std::string(cfg.api_keys_file.empty() && !cfg.api_keys_from_redis
                                           ? "the client's Authorization"
                                           : "the client's API key")
                         : "header " + cfg.conversation_scope_header,
                     cfg.conversation_anonymous_reuse
                         ? "share one scope (--conversation-anonymous-reuse true)"
                         : "get no reuse (--conversation-anonymous-reuse false)");
      }
      gateway.start();
      control.run();
      gateway.wait();
      events->stop();
    }
    // Its thread reads the registry, which the gateway owns and destroys
    // (the /metrics hook keeps the object itself alive until then).
    if (load_sync)
      load_sync->stop();
  }
  return rc;
}
