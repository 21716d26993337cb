// The rules that span several options (a decode instance at least, TLS
// files in pairs, no instance listed twice, ...), checked once a Config is
// whole, whatever it came from.
#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <utility>

#include "core/base/text.hpp"
#include "core/config/config.hpp"
#include "core/config/detail/raw_options.hpp"
#include "core/config/detail/values.hpp"

namespace pdgate {

std::optional<std::string> label_problem(const std::map<std::string, std::string>& labels,
                                         std::string_view owner) {
  using L = LabelLimits;
  if (labels.size() > L::kMaxCount) {
    return "at most " + std::to_string(L::kMaxCount) + " labels per " + std::string(owner) +
           " (got " + std::to_string(labels.size()) + ")";
  }
  std::size_t total = 0;
  for (const auto& [k, v] : labels) {
    if (k.empty())
      return std::string("a label name must not be empty");
    if (k.size() > L::kMaxKeyBytes) {
      return "label name '" + k.substr(0, 32) + "...' is longer than " +
             std::to_string(L::kMaxKeyBytes) + " bytes";
    }
    if (v.size() > L::kMaxValueBytes) {
      return "label '" + k + "' has a value longer than " + std::to_string(L::kMaxValueBytes) +
             " bytes (" + std::to_string(v.size()) + ")";
    }
    total += k.size() + v.size();
  }
  if (total > L::kMaxTotalBytes) {
    return "the labels of one " + std::string(owner) + " may hold at most " +
           std::to_string(L::kMaxTotalBytes) + " bytes of names and values (got " +
           std::to_string(total) + ")";
  }
  return std::nullopt;
}

Result<Config> validate(Config c) {
  config_detail::Errors errors;
  const auto has_dns = [&](Role role) {
    return std::any_of(c.dns_sources.begin(), c.dns_sources.end(),
                       [&](const DnsSource& d) { return d.role == role; });
  };
  if (c.decode.empty() && !has_dns(Role::decode)) {
    errors.push_back(
        "no decode instances: give --decode, --decoder-host/--decoder-port or "
        "--decode-servers-urls");
  }
  if (c.prefill_disabled && !c.prefill.empty()) {
    errors.push_back(
        "--prefill-servers-urls disables prefill, but prefill instances were also given "
        "(--prefill or --prefiller-host)");
  }
  if (c.prefill_disabled && has_dns(Role::prefill)) {
    errors.push_back(
        "--prefill-servers-urls disables prefill, but a dns:// prefill source was given");
  }
  if (c.prefill.empty() && !has_dns(Role::prefill) && !c.prefill_disabled &&
      c.kv_connector != "none") {
    errors.push_back(
        "no prefill instances: give --prefill, --prefiller-host/--prefiller-port or "
        "--prefill-servers-urls, or send requests in one hop with --prefill-servers-urls "
        "disable");
  }
  if (c.host.empty())
    errors.push_back("--host must not be empty");
  if (c.tls_cert.empty() != c.tls_key.empty())
    errors.push_back("--tls-cert and --tls-key go together: give both or neither");
  if (!c.tls_client_ca.empty() && c.tls_cert.empty())
    errors.push_back("--tls-client-ca needs --tls-cert and --tls-key");
  if (c.admin_tls_cert.empty() != c.admin_tls_key.empty())
    errors.push_back("--admin-tls-cert and --admin-tls-key go together: give both or neither");
  if (!c.admin_tls_client_ca.empty() && c.admin_tls_cert.empty())
    errors.push_back("--admin-tls-client-ca needs --admin-tls-cert and --admin-tls-key");
  if (c.redis_tls_cert.empty() != c.redis_tls_key.empty())
    errors.push_back("--redis-tls-cert and --redis-tls-key go together: give both or neither");
  if (c.upstream_cert.empty() != c.upstream_key.empty())
    errors.push_back("--upstream-cert and --upstream-key go together: give both or neither");
  if (c.workers > 1024) {
    errors.push_back("--workers: at most 1024 (got " + std::to_string(c.workers) + ")");
  }
  if (auto k = config_detail::parse_kv_connector(c.kv_connector); !k)
    errors.push_back("--kv-connector: " + k.error());
  if (auto l = config_detail::parse_log_level(c.log_level); !l)
    errors.push_back("--log-level: " + l.error());
  if (c.max_body_bytes == 0)
    errors.push_back("--max-body-size must be at least 1 byte");
  if (c.body_memory_limit < (1u << 20)) {
    errors.push_back("--body-memory-limit must be at least 1MiB (got " +
                     std::to_string(c.body_memory_limit) + " bytes)");
  }
  if (c.answer_memory_limit < (1u << 20)) {
    errors.push_back("--answer-memory-limit must be at least 1MiB (got " +
                     std::to_string(c.answer_memory_limit) + " bytes)");
  }
  if (c.max_connections == 0)
    errors.push_back("--max-connections must be at least 1");
  if (c.encode_max_items == 0 || c.encode_concurrency == 0 || c.encode_max_inflight == 0)
    errors.push_back(
        "--encode-max-items, --encode-concurrency and --encode-max-inflight must be at least 1");
  if (c.policy_memory < (1u << 20)) {
    errors.push_back("--policy-memory must be at least 1MiB (got " +
                     std::to_string(c.policy_memory) + " bytes)");
  }
  if (c.prefix_block_size < 16) {
    errors.push_back("--prefix-block-size must be at least 16 bytes (got " +
                     std::to_string(c.prefix_block_size) + ")");
  }
  if (c.load_sync_expiry < std::chrono::milliseconds(50) ||
      (c.load_sync_interval.count() > 0 && c.load_sync_expiry < 4 * c.load_sync_interval)) {
    errors.push_back(
        "--load-sync-expiry must be at least 50ms and 4 times --load-sync-interval "
        "(got " +
        config_detail::duration_text(c.load_sync_expiry) + ")");
  }
  if (c.load_sync_recheck_slot > std::chrono::milliseconds(50)) {
    errors.push_back("--load-sync-recheck-slot must be at most 50ms (got " +
                     config_detail::duration_text(c.load_sync_recheck_slot) + ")");
  }
  if (c.max_header_bytes < 1024) {
    errors.push_back("--max-header-size must be at least 1KiB (got " +
                     std::to_string(c.max_header_bytes) + " bytes)");
  }
  const std::pair<const char*, std::chrono::milliseconds> durations[] = {
      {"--header-timeout", c.header_timeout},
      {"--client-idle-timeout", c.client_idle_timeout},
      {"--connect-timeout", c.connect_timeout},
      {"--first-byte-timeout", c.first_byte_timeout},
      {"--upstream-idle-timeout", c.upstream_idle_timeout},
  };
  for (const auto& [name, d] : durations) {
    if (d.count() <= 0)
      errors.push_back(std::string(name) + " must be positive");
  }
  if (c.model_check_timeout > std::chrono::minutes(5)) {
    errors.push_back("--model-check-timeout must be at most 5m (an admin add waits for it)");
  }
  if (c.shutdown_timeout > std::chrono::hours(24)) {
    errors.push_back("--shutdown-timeout must be at most 24h");
  }
  if (c.api_keys_from_redis && c.redis_url.empty())
    errors.push_back("--api-keys-from-redis needs --redis");
  for (const auto* list : {&c.prefill, &c.decode, &c.encode}) {
    // Duplicates as written (host names compared without case); names
    // that resolve to the same address are caught when pdgate starts or
    // reloads, which resolves them.
    std::map<std::string, std::string> seen;
    for (const auto& u : *list) {
      if (u.port == 0 || u.host.empty()) {
        errors.push_back("invalid " + std::string(to_string(u.role)) + " instance '" + u.url + "'");
        continue;
      }
      const auto [it, fresh] = seen.emplace(lower(u.url), u.url);
      if (!fresh) {
        errors.push_back(std::string(to_string(u.role)) + " instance " + u.url +
                         " is listed twice (as " + it->second + " and " + u.url + ")");
      }
    }
  }
  if (!errors.empty())
    return config_detail::fail_all(errors);
  return c;
}

}  // namespace pdgate
