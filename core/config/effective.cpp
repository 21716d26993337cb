// The configuration in force as GET /admin/config shows it, and what a
// reload changes: each option's value in its flag's syntax (secrets
// masked), the diff between two configs, and the part of a new config a
// reload applies without a restart.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/url.hpp"
#include "core/config/config.hpp"
#include "core/config/detail/option_table.hpp"

namespace pdgate::config_detail {
namespace {

std::string duration_text(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0)
    return std::to_string(d.count() / 1000) + "s";
  return std::to_string(d.count()) + "ms";
}

std::string interval_text(std::chrono::milliseconds d) {
  return d.count() == 0 ? "off" : duration_text(d);
}

std::string size_text(std::size_t bytes) {
  constexpr std::pair<std::size_t, const char*> units[] = {
      {std::size_t{1} << 30, "GiB"}, {std::size_t{1} << 20, "MiB"}, {std::size_t{1} << 10, "KiB"}};
  for (const auto& [unit, name] : units) {
    if (bytes >= unit && bytes % unit == 0)
      return std::to_string(bytes / unit) + name;
  }
  return std::to_string(bytes);
}

std::string bool_text(bool b) {
  return b ? "true" : "false";
}

// An instance as the config shows it: its URL, then what a YAML entry
// added to it.
std::string instance_text(const UpstreamSpec& u) {
  std::string out = u.url;
  if (!u.kv_peer.empty())
    out += "@" + u.kv_peer;
  if (!u.labels.empty()) {
    out += " labels={";
    bool first = true;
    for (const auto& [k, v] : u.labels) {
      out += (first ? "" : ",") + k + "=" + v;
      first = false;
    }
    out += "}";
  }
  if (u.weight != 1)
    out += " weight=" + std::to_string(u.weight);
  return out;
}

// A role's list as written: its instances, then its dns:// sources.
std::vector<std::string> instance_texts(const std::vector<UpstreamSpec>& list,
                                        const std::vector<DnsSource>& dns, Role role) {
  std::vector<std::string> out;
  for (const auto& u : list)
    out.push_back(instance_text(u));
  for (const auto& d : dns) {
    if (d.role == role)
      out.push_back(d.text());
  }
  return out;
}

std::string join_urls(const std::vector<UpstreamSpec>& list) {
  std::string out;
  for (const auto& u : list)
    out += (out.empty() ? "" : ",") + u.url;
  return out;
}

// The effective value of one option; the engine forms that are other
// spellings of the same lists (multi-turn, EPD) show those lists.
std::vector<std::string> option_value(const Config& c, std::string_view key) {
  const auto hosts = [](const std::vector<UpstreamSpec>& list) {
    std::vector<std::string> out;
    for (const auto& u : list)
      out.push_back(u.host);
    return out;
  };
  const auto ports = [](const std::vector<UpstreamSpec>& list) {
    std::vector<std::string> out;
    for (const auto& u : list)
      out.push_back(std::to_string(u.port));
    return out;
  };
  const std::map<std::string_view, std::function<std::vector<std::string>()>> values = {
      {"host", [&] { return std::vector{c.host}; }},
      {"port", [&] { return std::vector{std::to_string(c.port)}; }},
      {"workers", [&] { return std::vector{std::to_string(c.workers)}; }},
      {"tls-cert", [&] { return std::vector{c.tls_cert}; }},
      {"tls-key", [&] { return std::vector{c.tls_key}; }},
      {"tls-client-ca", [&] { return std::vector{c.tls_client_ca}; }},
      {"tls-min-version",
       [&] { return std::vector{std::string(c.tls_min_version == 13 ? "1.3" : "1.2")}; }},
      {"upstream-ca", [&] { return std::vector{c.upstream_ca}; }},
      {"upstream-cert", [&] { return std::vector{c.upstream_cert}; }},
      {"upstream-key", [&] { return std::vector{c.upstream_key}; }},
      {"upstream-insecure", [&] { return std::vector{bool_text(c.upstream_insecure)}; }},
      {"model", [&] { return std::vector{c.model}; }},
      {"prefill", [&] { return instance_texts(c.prefill, c.dns_sources, Role::prefill); }},
      {"decode", [&] { return instance_texts(c.decode, c.dns_sources, Role::decode); }},
      {"prefiller-host", [&] { return hosts(c.prefill); }},
      {"prefiller-port", [&] { return ports(c.prefill); }},
      {"decoder-host", [&] { return hosts(c.decode); }},
      {"decoder-port", [&] { return ports(c.decode); }},
      {"encode-servers-urls", [&] { return std::vector{join_urls(c.encode)}; }},
      {"prefill-servers-urls",
       [&] {
         return std::vector{c.prefill_disabled ? std::string("disable") : join_urls(c.prefill)};
       }},
      {"decode-servers-urls", [&] { return std::vector{join_urls(c.decode)}; }},
      {"kv-connector", [&] { return std::vector{c.kv_connector}; }},
      {"kv-events",
       [&] {
         std::vector<std::string> out;
         for (const auto* list : {&c.prefill, &c.decode, &c.encode}) {
           for (const auto& u : *list) {
             if (u.kv_events.endpoint.empty())
               continue;
             std::string v = u.url + "=" + u.kv_events.endpoint;
             if (!u.kv_events.replay.empty())
               v += ",replay=" + u.kv_events.replay;
             if (std::find(out.begin(), out.end(), v) == out.end())
               out.push_back(std::move(v));
           }
         }
         return out;
       }},
      {"kv-events-replay-timeout",
       [&] { return std::vector{duration_text(c.kv_events_replay_timeout)}; }},
      {"kv-index-blocks-per-instance",
       [&] { return std::vector{std::to_string(c.kv_index_blocks_per_instance)}; }},
      {"kv-index-max-blocks", [&] { return std::vector{std::to_string(c.kv_index_max_blocks)}; }},
      {"tokenizer", [&] { return std::vector{c.tokenizer}; }},
      {"tokenizer-timeout", [&] { return std::vector{duration_text(c.tokenizer_timeout)}; }},
      {"max-body-size", [&] { return std::vector{size_text(c.max_body_bytes)}; }},
      {"max-header-size", [&] { return std::vector{size_text(c.max_header_bytes)}; }},
      {"body-memory-limit", [&] { return std::vector{size_text(c.body_memory_limit)}; }},
      {"header-timeout", [&] { return std::vector{duration_text(c.header_timeout)}; }},
      {"client-idle-timeout", [&] { return std::vector{duration_text(c.client_idle_timeout)}; }},
      {"connect-timeout", [&] { return std::vector{duration_text(c.connect_timeout)}; }},
      {"first-byte-timeout", [&] { return std::vector{duration_text(c.first_byte_timeout)}; }},
      {"upstream-idle-timeout",
       [&] { return std::vector{duration_text(c.upstream_idle_timeout)}; }},
      {"upstream-max-idle", [&] { return std::vector{std::to_string(c.upstream_max_idle)}; }},
      {"policy", [&] { return std::vector{c.policy}; }},
      {"policy-prefill", [&] { return std::vector{c.policy_prefill}; }},
      {"policy-decode", [&] { return std::vector{c.policy_decode}; }},
      {"policy-encode", [&] { return std::vector{c.policy_encode}; }},
      {"policy-dir", [&] { return std::vector{c.policy_dir}; }},
      {"policy-budget-us", [&] { return std::vector{std::to_string(c.policy_budget.count())}; }},
      {"policy-memory", [&] { return std::vector{size_text(c.policy_memory)}; }},
      {"prefix-block-size", [&] { return std::vector{size_text(c.prefix_block_size)}; }},
      {"policy-poll-interval", [&] { return std::vector{duration_text(c.policy_poll_interval)}; }},
      {"metrics-interval", [&] { return std::vector{interval_text(c.metrics_interval)}; }},
      {"redis", [&] { return std::vector{mask_url_password(c.redis_url)}; }},
      {"redis-key-prefix", [&] { return std::vector{c.redis_key_prefix}; }},
      {"redis-timeout", [&] { return std::vector{duration_text(c.redis_timeout)}; }},
      {"shared-kv-index", [&] { return std::vector{bool_text(c.shared_kv_index)}; }},
      {"api-keys", [&] { return std::vector{c.api_keys_file}; }},
      {"api-keys-from-redis", [&] { return std::vector{bool_text(c.api_keys_from_redis)}; }},
      {"limits-on-redis-failure",
       [&] { return std::vector{std::string(c.limits_fail_open ? "open" : "closed")}; }},
      {"dns-interval", [&] { return std::vector{duration_text(c.dns_interval)}; }},
      {"dns-server", [&] { return std::vector{c.dns_server}; }},
      {"otlp-endpoint", [&] { return std::vector{c.otlp_endpoint}; }},
      {"trace-sample-ratio",
       [&] {
         std::ostringstream out;
         out << c.trace_sample_ratio;
         return std::vector{out.str()};
       }},
      {"otlp-batch-size", [&] { return std::vector{std::to_string(c.otlp_batch_size)}; }},
      {"otlp-export-interval", [&] { return std::vector{duration_text(c.otlp_export_interval)}; }},
      {"otlp-queue-size", [&] { return std::vector{std::to_string(c.otlp_queue_size)}; }},
      {"otlp-timeout", [&] { return std::vector{duration_text(c.otlp_timeout)}; }},
      {"forward-headers", [&] { return c.forward_headers; }},
      // Values may be credentials: names only.
      {"set-header",
       [&] {
         std::vector<std::string> out;
         for (const auto& [name, value] : c.set_headers)
           out.push_back(name + ": ***");
         return out;
       }},
      {"conversation-ttl",
       [&] {
         return std::vector{duration_text(
             std::chrono::duration_cast<std::chrono::milliseconds>(c.conversation_ttl))};
       }},
      {"conversation-cache-size",
       [&] { return std::vector{std::to_string(c.conversation_cache_size)}; }},
      {"conversation-scope-header", [&] { return std::vector{c.conversation_scope_header}; }},
      {"expose-kv-params", [&] { return std::vector{bool_text(c.expose_kv_params)}; }},
      {"verbose-errors", [&] { return std::vector{bool_text(c.verbose_errors)}; }},
      {"profile-routes", [&] { return std::vector{bool_text(c.profile_routes)}; }},
      {"admin-port",
       [&] {
         return std::vector{c.admin_enabled ? std::to_string(c.admin_port) : std::string("off")};
       }},
      {"admin-host", [&] { return std::vector{c.admin_host}; }},
      // The file's path, never its content (the key).
      {"admin-key-file", [&] { return std::vector{c.admin_key_file}; }},
      {"model-check-timeout", [&] { return std::vector{duration_text(c.model_check_timeout)}; }},
      {"shutdown-timeout", [&] { return std::vector{duration_text(c.shutdown_timeout)}; }},
      {"allowed-upstreams", [&] { return c.allowed_upstreams; }},
      {"health-interval", [&] { return std::vector{interval_text(c.health_interval)}; }},
      {"health-rise", [&] { return std::vector{std::to_string(c.health_rise)}; }},
      {"health-fall", [&] { return std::vector{std::to_string(c.health_fall)}; }},
      {"health-max-concurrency",
       [&] { return std::vector{std::to_string(c.health_max_concurrency)}; }},
      {"eject-after", [&] { return std::vector{std::to_string(c.eject_after)}; }},
      {"retry-budget",
       [&] {
         std::ostringstream out;
         out << c.retry_budget;
         return std::vector{out.str()};
       }},
      {"log-level", [&] { return std::vector{c.log_level}; }},
      {"access-log", [&] { return std::vector{c.access_log}; }},
      {"access-log-format", [&] { return std::vector{c.access_log_format}; }},
  };
  const auto it = values.find(key);
  // Every option a file may set has its row (a unit test checks it).
  return it == values.end() ? std::vector<std::string>{"(not shown)"} : it->second();
}

// Other spellings of an instance list: a reload reports the list's own key.
bool spells_another_key(std::string_view key) {
  return key.starts_with("prefiller-") || key.starts_with("decoder-") ||
         key == "decode-servers-urls" || key == "prefill-servers-urls";
}

}  // namespace
}  // namespace pdgate::config_detail

namespace pdgate {

std::string mask_url_password(const std::string& url) {
  return url_without_secrets(url);
}

std::vector<ConfigEntry> effective_config(const Config& c) {
  std::vector<ConfigEntry> out;
  for (const auto& o : config_detail::options()) {
    if (o.cli_only)
      continue;
    out.push_back({std::string(o.key), config_detail::option_value(c, o.key), o.list, o.restart});
  }
  return out;
}

ConfigDiff diff_config(const Config& before, const Config& after) {
  ConfigDiff d;
  // What is applied is what reloadable_part() takes from `after` (with
  // prefill off, a prefill list stays as it was).
  const Config applied = reloadable_part(before, after);
  for (const auto& o : config_detail::options()) {
    if (o.cli_only || config_detail::spells_another_key(o.key))
      continue;
    const Config& now = o.restart ? after : applied;
    if (config_detail::option_value(before, o.key) == config_detail::option_value(now, o.key))
      continue;
    (o.restart ? d.restart_needed : d.applied).emplace_back(o.key);
  }
  // DNS sources are resolved by a discovery started once.
  const auto dns_texts = [](const Config& c) {
    std::vector<std::string> t;
    for (const auto& d : c.dns_sources)
      t.push_back(std::string(to_string(d.role)) + " " + d.text());
    return t;
  };
  if (dns_texts(before) != dns_texts(after))
    d.restart_needed.emplace_back("dns:// instance sources");
  // Whether prefill runs at all shapes each worker's pipeline.
  if (before.prefill_disabled != after.prefill_disabled)
    d.restart_needed.emplace_back("prefill-servers-urls (disable)");
  return d;
}

Config reloadable_part(const Config& running, Config c) {
  // Prefill switched on or off waits for a restart, and so does the
  // prefill list meanwhile: an empty one cannot serve, and one given
  // while prefill is off has no stage to serve.
  if (running.prefill_disabled || c.prefill_disabled != running.prefill_disabled)
    c.prefill = running.prefill;
  c.host = running.host;
  c.port = running.port;
  c.workers = running.workers;
  c.model = running.model;
  c.kv_connector = running.kv_connector;
  c.prefill_disabled = running.prefill_disabled;
  c.upstream_idle_timeout = running.upstream_idle_timeout;
  c.upstream_max_idle = running.upstream_max_idle;
  c.policy_poll_interval = running.policy_poll_interval;
  c.metrics_interval = running.metrics_interval;
  c.redis_url = running.redis_url;
  c.redis_key_prefix = running.redis_key_prefix;
  c.redis_timeout = running.redis_timeout;
  c.conversation_cache_size = running.conversation_cache_size;
  c.profile_routes = running.profile_routes;
  c.admin_enabled = running.admin_enabled;
  c.admin_port = running.admin_port;
  c.admin_host = running.admin_host;
  c.admin_key_file = running.admin_key_file;
  c.model_check_timeout = running.model_check_timeout;
  c.shutdown_timeout = running.shutdown_timeout;
  c.allowed_upstreams = running.allowed_upstreams;
  c.health_interval = running.health_interval;
  c.health_rise = running.health_rise;
  c.health_fall = running.health_fall;
  c.health_max_concurrency = running.health_max_concurrency;
  c.config_file = running.config_file;
  c.shared_kv_index = running.shared_kv_index;
  c.api_keys_file = running.api_keys_file;
  c.api_keys_from_redis = running.api_keys_from_redis;
  c.limits_fail_open = running.limits_fail_open;
  c.dns_interval = running.dns_interval;
  c.dns_server = running.dns_server;
  // The event subscriptions and the exact index are set up once.
  c.kv_events_replay_timeout = running.kv_events_replay_timeout;
  c.kv_index_blocks_per_instance = running.kv_index_blocks_per_instance;
  c.kv_index_max_blocks = running.kv_index_max_blocks;
  c.tokenizer = running.tokenizer;
  // The TLS files are re-read on every reload (core/net/tls_context.hpp), from
  // the paths given at start; the engines' context is made once.
  c.tls_cert = running.tls_cert;
  c.tls_key = running.tls_key;
  c.tls_client_ca = running.tls_client_ca;
  c.tls_min_version = running.tls_min_version;
  c.upstream_ca = running.upstream_ca;
  c.upstream_cert = running.upstream_cert;
  c.upstream_key = running.upstream_key;
  c.upstream_insecure = running.upstream_insecure;
  // The access log is opened once, when the listener binds.
  // The span exporter is started once.
  c.otlp_endpoint = running.otlp_endpoint;
  c.otlp_batch_size = running.otlp_batch_size;
  c.otlp_export_interval = running.otlp_export_interval;
  c.otlp_queue_size = running.otlp_queue_size;
  c.otlp_timeout = running.otlp_timeout;
  c.access_log = running.access_log;
  c.access_log_format = running.access_log_format;
  // DNS sources are resolved by a discovery started once.
  c.dns_sources = running.dns_sources;
  return c;
}

}  // namespace pdgate
