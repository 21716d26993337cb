// The setters written for one option each (the templates that serve a
// whole kind of field are in detail/fields.hpp): each checks its option's
// text and sets the Config field(s) it stands for.
#include <cctype>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

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

}  // namespace pdgate::config_detail
