// The setters and printers written for one option each (the templates
// that serve a whole kind of field are in detail/fields.hpp): a setter
// checks its option's text and sets the Config field(s) it stands for; a
// printer writes them back as the flag takes them.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "core/base/text.hpp"
#include "core/base/url.hpp"
#include "core/config/config.hpp"
#include "core/config/detail/fields.hpp"
#include "core/config/detail/values.hpp"

namespace pdgate::config_detail {

Result<bool> set_tokenizer(Config& c, std::string_view v) {
  const std::string word = lower(trim(v));
  if (word != "sim" && word != "vllm" && word != "none")
    return fail("expected sim, vllm or none");
  c.tokenizer = word;
  return true;
}

Result<bool> set_fail_mode(Config& c, std::string_view v) {
  const std::string word = lower(trim(v));
  if (word != "open" && word != "closed")
    return fail("expected open or closed");
  c.limits_fail_open = word == "open";
  return true;
}

Result<bool> set_tls_version(Config& c, std::string_view v) {
  const std::string_view t = trim(v);
  if (t == "1.2")
    c.tls_min_version = 12;
  else if (t == "1.3")
    c.tls_min_version = 13;
  else
    return fail("expected 1.2 or 1.3");
  return true;
}

Result<bool> set_host(Config& c, std::string_view v) {
  if (trim(v).empty())
    return fail("the listen address must not be empty");
  c.host = std::string(trim(v));
  return true;
}

Result<bool> set_port(Config& c, std::string_view v) {
  auto p = parse_port(trim(v), true);
  if (!p)
    return fail(p.error());
  c.port = *p;
  return true;
}

Result<bool> set_kv_connector(Config& c, std::string_view v) {
  auto k = parse_kv_connector(v);
  if (!k)
    return fail(k.error());
  c.kv_connector = *k;
  return true;
}

Result<bool> set_nixl_transfer_mode(Config& c, std::string_view v) {
  auto k = parse_choice(v, {"auto", "pull", "push"});
  if (!k)
    return fail(k.error());
  c.nixl_transfer_mode = *k;
  return true;
}

Result<bool> set_mooncake_legs(Config& c, std::string_view v) {
  auto k = parse_choice(v, {"parallel", "sequential"});
  if (!k)
    return fail(k.error());
  c.mooncake_legs = *k;
  return true;
}

Result<bool> set_mooncake_bootstrap_port(Config& c, std::string_view v) {
  auto p = parse_port(trim(v), true);
  if (!p)
    return fail(p.error());
  c.mooncake_bootstrap_port = *p;
  return true;
}

Result<bool> set_scope_header(Config& c, std::string_view v) {
  std::string name(trim(v));
  for (auto& ch : name) {
    const auto u = static_cast<unsigned char>(ch);
    if (!std::isalnum(u) && std::string_view("!#$%&'*+-.^_`|~").find(ch) == std::string_view::npos)
      return fail("not a header name");
    ch = static_cast<char>(std::tolower(u));
  }
  c.conversation_scope_header = std::move(name);
  return true;
}

Result<bool> set_expose_kv_params(Config& c, std::string_view v) {
  c.expose_kv_params = trim(v) == "true" || trim(v) == "1";
  return true;
}

Result<bool> set_policy_budget(Config& c, std::string_view v) {
  auto n = parse_uint(trim(v), 10'000'000);
  if (!n)
    return fail(n.error());
  if (*n == 0)
    return fail("must be at least 1 microsecond");
  c.policy_budget = std::chrono::microseconds(*n);
  return true;
}

Result<bool> set_admin_port(Config& c, std::string_view v) {
  unsigned long n = 0;
  const std::string t(trim(v));
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
  if (ec != std::errc() || p != t.data() + t.size() || n > 65535)
    return fail("not a port number (0-65535)");
  c.admin_port = static_cast<std::uint16_t>(n);
  c.admin_enabled = true;
  return true;
}

Result<bool> set_access_log(Config& c, std::string_view v) {
  const std::string path(trim(v));
  if (path.empty())
    return fail("expected a file path, stderr or off");
  c.access_log = path;
  return true;
}

Result<bool> set_access_log_format(Config& c, std::string_view v) {
  const std::string f(trim(v));
  if (f != "text" && f != "json")
    return fail("expected text or json (got " + f + ")");
  c.access_log_format = f;
  return true;
}

Result<bool> set_log_level(Config& c, std::string_view v) {
  auto l = parse_log_level(v);
  if (!l)
    return fail(l.error());
  c.log_level = *l;
  return true;
}

Result<bool> set_otlp_endpoint(Config& c, std::string_view v) {
  const std::string_view t = trim(v);
  if (!t.empty()) {
    if (auto e = parse_http_endpoint(t, "/v1/traces"); !e)
      return fail(e.error());
  }
  c.otlp_endpoint = std::string(t);
  return true;
}

namespace {

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
std::vector<std::string> hosts(const std::vector<UpstreamSpec>& list) {
  std::vector<std::string> out;
  for (const auto& u : list)
    out.push_back(u.host);
  return out;
}

std::vector<std::string> ports(const std::vector<UpstreamSpec>& list) {
  std::vector<std::string> out;
  for (const auto& u : list)
    out.push_back(std::to_string(u.port));
  return out;
}

}  // namespace

std::vector<std::string> show_prefill(const Config& c) {
  return instance_texts(c.prefill, c.dns_sources, Role::prefill);
}

std::vector<std::string> show_decode(const Config& c) {
  return instance_texts(c.decode, c.dns_sources, Role::decode);
}

std::vector<std::string> show_prefiller_hosts(const Config& c) {
  return hosts(c.prefill);
}

std::vector<std::string> show_prefiller_ports(const Config& c) {
  return ports(c.prefill);
}

std::vector<std::string> show_decoder_hosts(const Config& c) {
  return hosts(c.decode);
}

std::vector<std::string> show_decoder_ports(const Config& c) {
  return ports(c.decode);
}

std::vector<std::string> show_encode_urls(const Config& c) {
  return {join_urls(c.encode)};
}

std::vector<std::string> show_prefill_urls(const Config& c) {
  return {c.prefill_disabled ? std::string("disable") : join_urls(c.prefill)};
}

std::vector<std::string> show_decode_urls(const Config& c) {
  return {join_urls(c.decode)};
}

std::vector<std::string> show_kv_events(const Config& c) {
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
}

std::vector<std::string> show_data_parallel(const Config& c) {
  std::vector<std::string> out;
  for (const auto* list : {&c.prefill, &c.decode}) {
    for (const auto& u : *list) {
      if (u.dp_size <= 1)
        continue;
      std::string v = u.url + "=" + std::to_string(u.dp_size);
      if (std::find(out.begin(), out.end(), v) == out.end())
        out.push_back(std::move(v));
    }
  }
  return out;
}

std::vector<std::string> show_set_headers(const Config& c) {
  std::vector<std::string> out;
  for (const auto& [name, value] : c.set_headers)
    out.push_back(name + ": ***");
  return out;
}

std::vector<std::string> show_policy_log_levels(const Config& c) {
  std::vector<std::string> out;
  for (const auto& [name, level] : c.policy_log_levels)
    out.push_back(name + "=" + level);
  return out;
}

std::vector<std::string> show_tls_version(const Config& c) {
  return {std::string(c.tls_min_version == 13 ? "1.3" : "1.2")};
}

std::vector<std::string> show_fail_mode(const Config& c) {
  return {std::string(c.limits_fail_open ? "open" : "closed")};
}

std::vector<std::string> show_policy_budget(const Config& c) {
  return {std::to_string(c.policy_budget.count())};
}

std::vector<std::string> show_redis(const Config& c) {
  return {mask_url_password(c.redis_url)};
}

std::vector<std::string> show_admin_port(const Config& c) {
  return {c.admin_enabled ? std::to_string(c.admin_port) : std::string("off")};
}

void keep_admin_port(Config& to, const Config& from) {
  to.admin_enabled = from.admin_enabled;
  to.admin_port = from.admin_port;
}

}  // namespace pdgate::config_detail
