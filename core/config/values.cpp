// One option's value, read and written: the shared parsers of
// detail/values.hpp and the public ones of config.hpp (roles, instance
// addresses, DNS sources, HTTP endpoints, KV-event endpoints), each saying
// why a text is refused, and the printers that write a value back in the
// syntax its flag takes. None knows which option it serves.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "core/base/http_tokens.hpp"
#include "core/base/text.hpp"
#include "core/base/url.hpp"
#include "core/config/config.hpp"
#include "core/config/detail/values.hpp"

namespace pdgate::config_detail {

std::string normalize_name(std::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

Result<std::uint64_t> parse_uint(std::string_view text, std::uint64_t max) {
  std::uint64_t v = 0;
  const auto* first = text.data();
  const auto* last = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(first, last, v);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != last) {
    return fail("'" + std::string(text) + "' is not a non-negative integer");
  }
  if (ec == std::errc::result_out_of_range || v > max) {
    return fail("'" + std::string(text) + "' is too large (at most " + std::to_string(max) + ")");
  }
  return v;
}

namespace {

// Splits "1.5" into its value times 1000, so durations keep millisecond
// precision without floating point.
Result<std::uint64_t> parse_milli_units(std::string_view number) {
  const std::size_t dot = number.find('.');
  const std::string_view whole = number.substr(0, dot);
  std::string_view frac = dot == std::string_view::npos ? "" : number.substr(dot + 1);
  if (whole.empty() && frac.empty())
    return fail("missing number");
  std::uint64_t w = 0;
  if (!whole.empty()) {
    auto r = parse_uint(whole, std::numeric_limits<std::uint32_t>::max());
    if (!r)
      return fail(r.error());
    w = *r;
  }
  if (frac.size() > 3)
    return fail("more than millisecond precision");
  std::uint64_t f = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const char c = i < frac.size() ? frac[i] : '0';
    if (c < '0' || c > '9')
      return fail("not a number");
    f = f * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return w * 1000 + f;
}

}  // namespace

Result<std::chrono::milliseconds> parse_duration(std::string_view text) {
  const std::string_view t = trim(text);
  std::size_t unit_at = 0;
  while (unit_at < t.size() &&
         (std::isdigit(static_cast<unsigned char>(t[unit_at])) != 0 || t[unit_at] == '.')) {
    ++unit_at;
  }
  const std::string unit = lower(trim(t.substr(unit_at)));
  std::uint64_t per_unit_ms = 0;  // milliseconds per unit
  if (unit.empty() || unit == "s") {
    per_unit_ms = 1000;
  } else if (unit == "ms") {
    per_unit_ms = 1;
  } else if (unit == "m" || unit == "min") {
    per_unit_ms = 60'000;
  } else if (unit == "h") {
    per_unit_ms = 3'600'000;
  } else {
    return fail("invalid duration '" + std::string(text) +
                "' (expected e.g. 500ms, 10s, 2m or a number of seconds)");
  }
  auto milli = parse_milli_units(t.substr(0, unit_at));
  if (!milli) {
    return fail("invalid duration '" + std::string(text) +
                "' (expected e.g. 500ms, 10s, 2m or a number of seconds)");
  }
  // milli is the number times 1000; the product stays far below 2^63 since
  // the whole part is capped at 2^32.
  const std::uint64_t ms = *milli * per_unit_ms / 1000;
  if (ms == 0)
    return fail("duration '" + std::string(text) + "' must be at least 1ms");
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

Result<std::size_t> parse_size(std::string_view text) {
  const std::string_view t = trim(text);
  std::size_t unit_at = 0;
  while (unit_at < t.size() && std::isdigit(static_cast<unsigned char>(t[unit_at])) != 0) {
    ++unit_at;
  }
  const std::string unit = lower(trim(t.substr(unit_at)));
  std::uint64_t mult = 0;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "k" || unit == "kib") {
    mult = 1ull << 10;
  } else if (unit == "m" || unit == "mib") {
    mult = 1ull << 20;
  } else if (unit == "g" || unit == "gib") {
    mult = 1ull << 30;
  }
  const auto n = parse_uint(t.substr(0, unit_at), std::numeric_limits<std::uint32_t>::max());
  if (mult == 0 || !n) {
    return fail("invalid size '" + std::string(text) +
                "' (expected bytes or a number with K, KiB, M, MiB, G or GiB)");
  }
  const std::uint64_t bytes = *n * mult;
  if (bytes == 0)
    return fail("size '" + std::string(text) + "' must be at least 1 byte");
  if (bytes > std::numeric_limits<std::size_t>::max()) {
    return fail("size '" + std::string(text) + "' is too large");
  }
  return static_cast<std::size_t>(bytes);
}

Result<std::string> parse_log_level(std::string_view text) {
  std::string l = lower(trim(text));
  if (l == "warning")
    l = "warn";
  for (std::string_view ok : {"trace", "debug", "info", "warn", "error"}) {
    if (l == ok)
      return l;
  }
  return fail("invalid log level '" + std::string(text) +
              "' (expected trace, debug, info, warn or error)");
}

Result<std::pair<std::string, std::string>> parse_policy_log_level(std::string_view text) {
  const std::string_view t = trim(text);
  const auto eq = t.find('=');
  if (eq == std::string_view::npos)
    return fail("expected NAME=LEVEL, e.g. tenant_slo=debug (got '" + std::string(t) + "')");
  const std::string_view name = trim(t.substr(0, eq));
  if (name.empty() || name.size() > 128 ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") !=
          std::string_view::npos)
    return fail("invalid policy name '" + std::string(name) +
                "' (the policy's name as in metrics: the script's file name without .lua)");
  auto level = parse_log_level(t.substr(eq + 1));
  if (!level)
    return fail(level.error());
  return std::pair{std::string(name), std::move(*level)};
}

Result<bool> parse_switch(std::string_view text) {
  const std::string l = lower(trim(text));
  if (l == "true" || l == "on" || l == "yes" || l == "1")
    return true;
  if (l == "false" || l == "off" || l == "no" || l == "0")
    return false;
  return fail("invalid switch '" + std::string(text) + "' (expected on/off or true/false)");
}

Result<std::string> parse_kv_connector(std::string_view text) {
  const std::string l = normalize_name(lower(trim(text)));
  if (l == "nixl" || l == "nixlconnector")
    return std::string("nixl");
  if (l == "p2p-nccl" || l == "p2pnccl" || l == "p2pncclconnector")
    return std::string("p2p-nccl");
  if (l == "lmcache" || l == "lmcacheconnector" || l == "lmcacheconnectorv1") {
    return std::string("lmcache");
  }
  if (l == "mooncake" || l == "mooncakeconnector")
    return std::string("mooncake");
  if (l == "none")
    return std::string("none");
  return fail("invalid kv connector '" + std::string(text) +
              "' (expected nixl, mooncake, p2p-nccl, lmcache or none)");
}

Result<std::string> parse_choice(std::string_view text,
                                 std::initializer_list<std::string_view> choices) {
  const std::string l = lower(trim(text));
  std::string expected;
  for (std::string_view c : choices) {
    if (l == c)
      return std::string(c);
    expected += expected.empty() ? "" : "|";
    expected += c;
  }
  return fail("invalid value '" + std::string(text) + "' (expected " + expected + ")");
}

namespace {

// A ZMQ endpoint an engine's events come from: tcp://host:port (or
// ipc://path).
Result<std::string> parse_zmq_endpoint(std::string_view text) {
  const std::string t(trim(text));
  if (t.starts_with("ipc://") && t.size() > 6)
    return t;
  if (!t.starts_with("tcp://"))
    return fail("'" + t + "' is not a ZMQ endpoint (expected tcp://host:port or ipc://path)");
  // The engine binds tcp://*:port; pdgate needs the address to connect to.
  if (t.starts_with("tcp://*"))
    return fail("'" + t + "' must name the engine's host (not a wildcard)");
  auto u = parse_url(t);
  if (!u)
    return fail("'" + t + "': " + u.error());
  const UrlHost& h = u->hosts.front();
  if (u->has_userinfo || !u->path.empty() || u->query || u->fragment || h.host.empty() || !h.port)
    return fail("'" + t + "' has no host:port (expected tcp://host:port)");
  return t;
}

}  // namespace

Result<std::pair<std::string, KvEventsEndpoint>> parse_kv_events_flag(std::string_view text) {
  const auto eq = text.find('=');
  if (eq == std::string_view::npos)
    return fail("expected INSTANCE=tcp://host:port[,replay=tcp://host:port], got '" +
                std::string(text) + "'");
  auto instance = parse_upstream(Role::decode, std::string(trim(text.substr(0, eq))));
  if (!instance)
    return fail(instance.error());
  KvEventsEndpoint ev;
  std::string_view rest = text.substr(eq + 1);
  const auto comma = rest.find(',');
  ev.endpoint = std::string(trim(rest.substr(0, comma)));
  if (comma != std::string_view::npos) {
    const std::string_view opt = trim(rest.substr(comma + 1));
    if (!opt.starts_with("replay="))
      return fail("after the endpoint only replay=tcp://host:port may follow, got '" +
                  std::string(opt) + "'");
    ev.replay = std::string(opt.substr(7));
    if (trim(ev.replay).empty())
      return fail("replay= needs an endpoint");
  }
  auto checked = check_kv_events_endpoint(std::move(ev));
  if (!checked)
    return fail(checked.error());
  return std::make_pair(instance->url, std::move(*checked));
}

Result<std::pair<std::string, std::uint32_t>> parse_data_parallel_flag(std::string_view text) {
  const auto eq = text.rfind('=');
  if (eq == std::string_view::npos)
    return fail("expected INSTANCE=RANKS (e.g. http://host:8100=4), got '" + std::string(text) +
                "'");
  auto instance = parse_upstream(Role::decode, std::string(trim(text.substr(0, eq))));
  if (!instance)
    return fail(instance.error());
  auto n = parse_uint(trim(text.substr(eq + 1)), UpstreamSpec::kMaxDataParallelSize);
  if (!n || *n == 0)
    return fail("the number of data-parallel ranks must be an integer from 1 to " +
                std::to_string(UpstreamSpec::kMaxDataParallelSize) + ", got '" +
                std::string(trim(text.substr(eq + 1))) + "'");
  return std::make_pair(instance->url, static_cast<std::uint32_t>(*n));
}

Result<std::string> extra_header_name(std::string_view text) {
  const std::string name = lower(trim(text));
  if (!http_tokens::is_token(name))
    return fail("'" + std::string(text) + "' is not a header name");
  static constexpr std::string_view kHopByHop[] = {"connection",
                                                   "keep-alive",
                                                   "proxy-connection",
                                                   "te",
                                                   "trailer",
                                                   "transfer-encoding",
                                                   "upgrade",
                                                   "proxy-authenticate",
                                                   "proxy-authorization"};
  static constexpr std::string_view kFraming[] = {"content-length", "content-type", "host",
                                                  "expect"};
  static constexpr std::string_view kOwn[] = {"x-request-id", "user-agent",      "authorization",
                                              "via",          "traceparent",     "tracestate",
                                              "baggage",      "x-forwarded-for", "forwarded"};
  for (std::string_view n : kHopByHop) {
    if (name == n)
      return fail("'" + name + "' is a hop-by-hop header and cannot be passed to engines");
  }
  for (std::string_view n : kFraming) {
    if (name == n)
      return fail("'" + name + "' frames the request; pdgate writes it itself");
  }
  for (std::string_view n : kOwn) {
    if (name == n)
      return fail("'" + name + "' is written by pdgate itself (see docs/tracing.md)");
  }
  return name;
}

Result<std::pair<std::string, std::string>> parse_set_header(std::string_view text) {
  const std::size_t colon = text.find(':');
  if (colon == std::string_view::npos)
    return fail("'" + std::string(text) + "' is not 'Name: value'");
  auto name = extra_header_name(text.substr(0, colon));
  if (!name)
    return fail(name.error());
  const std::string_view value = trim(text.substr(colon + 1));
  if (value.empty())
    return fail("the value of header '" + *name + "' is empty");
  for (char ch : value) {
    const auto u = static_cast<unsigned char>(ch);
    if ((u < 0x20 && ch != '\t') || u == 0x7f)
      return fail("the value of header '" + *name + "' holds a control character (CR, LF, ...)");
  }
  return std::pair{*name, std::string(value)};
}

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

std::string fraction_text(double f) {
  std::ostringstream out;
  out << f;
  return out.str();
}

}  // namespace pdgate::config_detail

namespace pdgate {

namespace {

std::string endpoint_for_rank(const std::string& endpoint, std::uint32_t rank) {
  if (endpoint.empty() || rank == 0)
    return endpoint;
  if (endpoint.starts_with("tcp://")) {
    const std::size_t colon = endpoint.rfind(':');
    std::uint32_t base = 0;
    const char* first = endpoint.data() + colon + 1;
    const char* last = endpoint.data() + endpoint.size();
    const auto [end, ec] = std::from_chars(first, last, base);
    if (ec == std::errc() && end == last && base + rank <= 65535)
      return endpoint.substr(0, colon + 1) + std::to_string(base + rank);
    return endpoint;
  }
  return endpoint + "_dp" + std::to_string(rank);
}

}  // namespace

UpstreamSpec rank_spec(const UpstreamSpec& engine, std::uint32_t rank) {
  UpstreamSpec s = engine;
  s.dp_rank = rank;
  s.kv_events.endpoint = endpoint_for_rank(engine.kv_events.endpoint, rank);
  s.kv_events.replay = endpoint_for_rank(engine.kv_events.replay, rank);
  return s;
}

std::vector<UpstreamSpec> instance_specs(const UpstreamSpec& engine) {
  const std::uint32_t ranks =
      std::clamp<std::uint32_t>(engine.dp_size, 1, UpstreamSpec::kMaxDataParallelSize);
  if (ranks == 1)
    return {engine};
  std::vector<UpstreamSpec> out;
  out.reserve(ranks);
  for (std::uint32_t r = 0; r < ranks; ++r)
    out.push_back(rank_spec(engine, r));
  return out;
}

std::string instance_location(const UpstreamSpec& spec) {
  return spec.dp_rank ? spec.url + "#dp" + std::to_string(*spec.dp_rank) : spec.url;
}

Result<KvEventsEndpoint> check_kv_events_endpoint(KvEventsEndpoint ev) {
  auto endpoint = config_detail::parse_zmq_endpoint(ev.endpoint);
  if (!endpoint)
    return fail(endpoint.error());
  ev.endpoint = *endpoint;
  if (!trim(ev.replay).empty()) {
    auto replay = config_detail::parse_zmq_endpoint(ev.replay);
    if (!replay)
      return fail("replay: " + replay.error());
    ev.replay = *replay;
  } else {
    ev.replay.clear();
  }
  return ev;
}

std::optional<Role> role_from_string(std::string_view s) {
  for (Role r : {Role::prefill, Role::decode, Role::encode, Role::both}) {
    if (s == to_string(r))
      return r;
  }
  return std::nullopt;
}

const char* to_string(Role r) {
  switch (r) {
    case Role::prefill:
      return "prefill";
    case Role::decode:
      return "decode";
    case Role::encode:
      return "encode";
    case Role::both:
      return "both";
  }
  return "unknown";
}

Result<DnsSource> parse_dns_source(Role role, std::string_view text) {
  const auto bad = [&](const std::string& why) {
    return fail("invalid " + std::string(to_string(role)) + " DNS source '" + std::string(text) +
                "': " + why);
  };
  auto u = parse_url(text);
  if (!u)
    return bad(u.error());
  const UrlHost& h = u->hosts.front();
  if (u->has_userinfo || !u->path.empty() || u->query || u->fragment)
    return bad("expected dns://name:port and nothing more");
  if (h.host.empty() || h.host.size() > 253 || h.ipv6)
    return bad("invalid DNS name '" + h.host + "'");
  if (!h.port)
    return bad("missing port (expected dns://name:port)");
  return DnsSource{role, h.host, *h.port};
}

Result<UpstreamSpec> parse_upstream(Role role, const std::string& text) {
  const std::string_view t = trim(text);
  const auto bad = [&](const std::string& why) {
    return fail("invalid " + std::string(to_string(role)) + " address '" + std::string(t) +
                "': " + why);
  };
  if (t.empty())
    return bad("empty address (expected host:port or http://host:port)");
  // "http://host:port@zmqhost:zmqport": the instance's P2P NCCL (ZMQ)
  // address, which --kv-connector p2p-nccl names in request ids.
  if (const auto at = t.rfind('@'); at != std::string_view::npos) {
    // Not an address before '@': user info, refused below.
    if (auto base = parse_upstream(role, std::string(t.substr(0, at)))) {
      auto peer = parse_upstream(role, std::string(t.substr(at + 1)));
      if (!peer)
        return bad("kv peer address after '@': " + peer.error());
      base->kv_peer = host_port(peer->host, peer->port);
      return base;
    }
  }
  auto url = parse_url(t);
  if (!url)
    return bad(url.error());
  if (!url->scheme.empty() && url->scheme != "http" && url->scheme != "https")
    return bad("unsupported scheme '" + url->scheme + "': expected http:// or https://");
  if ((!url->path.empty() && url->path != "/") || url->query || url->fragment) {
    const std::string tail = url->path + (url->query ? "?" + *url->query : "") +
                             (url->fragment ? "#" + *url->fragment : "");
    return bad("paths, queries and fragments are not supported ('" + tail +
               "'): give the engine's base address, e.g. http://host:8100");
  }
  if (url->has_userinfo)
    return bad("user info is not supported");
  const UrlHost& h = url->hosts.front();
  if (!h.port)
    return bad(h.ipv6 ? "missing port (expected [addr]:port)"
                      : "missing port (expected host:port)");

  UpstreamSpec u;
  u.role = role;
  // vLLM's example scripts write "http://:8100" for a local engine.
  u.host = h.host.empty() ? "localhost" : h.host;
  u.port = *h.port;
  u.tls = url->scheme == "https";
  u.url = std::string(u.tls ? "https://" : "http://") + host_port(u.host, u.port);
  return u;
}

Result<HttpEndpoint> parse_http_endpoint(std::string_view url, std::string_view default_target) {
  const std::string_view t = trim(url);
  const auto bad = [&](const std::string& why) {
    return fail("invalid URL '" + std::string(t) + "': " + why);
  };
  auto u = parse_url(t);
  if (!u)
    return bad(u.error());
  if (u->scheme.empty())
    return bad("expected http://host[:port][/path] or https://host[:port][/path]");
  if (u->scheme != "http" && u->scheme != "https")
    return bad("only http:// and https:// are supported");
  if (u->query || u->fragment)
    return bad("queries and fragments are not supported");
  if (u->has_userinfo)
    return bad("user info is not supported");
  const UrlHost& h = u->hosts.front();
  if (h.host.empty())
    return bad("missing host");
  HttpEndpoint e;
  e.tls = u->scheme == "https";
  e.host = h.host;
  e.port = h.port.value_or(e.tls ? 443 : 80);
  e.target = u->path.empty() || u->path == "/" ? std::string(default_target) : u->path;
  return e;
}

}  // namespace pdgate
