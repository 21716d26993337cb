#include "core/config/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>

#include "core/base/text.hpp"
#include "core/base/url.hpp"

namespace pdgate {
namespace {

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

// true/false, on/off, yes/no, 1/0.
Result<bool> parse_switch(std::string_view text) {
  const std::string l = lower(trim(text));
  if (l == "true" || l == "on" || l == "yes" || l == "1")
    return true;
  if (l == "false" || l == "off" || l == "no" || l == "0")
    return false;
  return fail("invalid switch '" + std::string(text) + "' (expected on/off or true/false)");
}

// vLLM names connectors by class (NixlConnector, P2pNcclConnector,
// LMCacheConnectorV1); those names are accepted too, so a value copied from
// an engine's --kv-transfer-config works.
Result<std::string> parse_kv_connector(std::string_view text) {
  const std::string l = normalize_name(lower(trim(text)));
  if (l == "nixl" || l == "nixlconnector")
    return std::string("nixl");
  if (l == "p2p-nccl" || l == "p2pnccl" || l == "p2pncclconnector")
    return std::string("p2p-nccl");
  if (l == "lmcache" || l == "lmcacheconnector" || l == "lmcacheconnectorv1") {
    return std::string("lmcache");
  }
  if (l == "none")
    return std::string("none");
  return fail("invalid kv connector '" + std::string(text) +
              "' (expected nixl, p2p-nccl, lmcache or none)");
}

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

// --kv-events URL=ENDPOINT[,replay=ENDPOINT]: the instance it is for and
// where its events come from.
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

// How a value reaches the Config. Each entry of kOptions names its setter,
// so an option is added in one place: its entry (name, help, setter). The
// engine lists (the demo, multi-turn and EPD forms) combine several
// options and are set together by apply_engines(); list-valued options
// without a setter are read there or by apply_raw() itself.
using Apply = Result<bool> (*)(Config& c, std::string_view value);

template <auto Field>
Result<bool> set_text(Config& c, std::string_view v) {
  c.*Field = std::string(v);
  return true;
}

template <auto Field>
Result<bool> set_trimmed(Config& c, std::string_view v) {
  c.*Field = std::string(trim(v));
  return true;
}

template <auto Field>
Result<bool> set_name(Config& c, std::string_view v) {
  if (trim(v).empty())
    return fail("must not be empty");
  c.*Field = std::string(trim(v));
  return true;
}

template <auto Field>
Result<bool> set_size(Config& c, std::string_view v) {
  auto n = parse_size(v);
  if (!n)
    return fail(n.error());
  c.*Field = *n;
  return true;
}

template <auto Field>
Result<bool> set_duration(Config& c, std::string_view v) {
  auto d = parse_duration(v);
  if (!d)
    return fail(d.error());
  c.*Field = std::chrono::duration_cast<std::remove_reference_t<decltype(c.*Field)>>(*d);
  return true;
}

// A duration, or "off" (or 0) for never.
template <auto Field>
Result<bool> set_interval(Config& c, std::string_view v) {
  const std::string word = lower(trim(v));
  if (word == "off" || word == "0") {
    c.*Field = std::chrono::milliseconds(0);
    return true;
  }
  return set_duration<Field>(c, v);
}

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

template <auto Field>
Result<bool> set_switch(Config& c, std::string_view v) {
  auto b = parse_switch(v);
  if (!b)
    return fail(b.error());
  c.*Field = *b;
  return true;
}

template <auto Field, std::uint64_t Max>
Result<bool> set_uint(Config& c, std::string_view v) {
  auto n = parse_uint(trim(v), Max);
  if (!n)
    return fail(n.error());
  c.*Field = static_cast<std::remove_reference_t<decltype(c.*Field)>>(*n);
  return true;
}

// Counts of health checks and failures: 1 to 1000.
template <auto Field>
Result<bool> set_count(Config& c, std::string_view v) {
  unsigned n = 0;
  const std::string t(trim(v));
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
  if (ec != std::errc() || p != t.data() + t.size() || n < 1 || n > 1000)
    return fail("not a count from 1 to 1000");
  c.*Field = n;
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

// RFC 9110 token characters only (anything else cannot be a header
// name), lower-cased.
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

// Setting the admin port turns the admin listener on.
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

template <auto Field>
Result<bool> set_fraction(Config& c, std::string_view v) {
  const std::string t(trim(v));
  char* end = nullptr;
  const double f = std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || !(f >= 0.0 && f <= 1.0))
    return fail("not a fraction from 0 to 1");
  c.*Field = f;
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

bool is_token_char(char ch) {
  return std::isalnum(static_cast<unsigned char>(ch)) != 0 ||
         std::string_view("!#$%&'*+-.^_`|~").find(ch) != std::string_view::npos;
}

// A header name an engine request may carry from --forward-headers or
// --set-header, lower-cased; hop-by-hop and framing headers, and those
// pdgate writes itself, are refused (a second copy would be ambiguous or
// corrupt the request).
Result<std::string> extra_header_name(std::string_view text) {
  const std::string name = lower(trim(text));
  if (name.empty() || !std::all_of(name.begin(), name.end(), is_token_char))
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

// "Name: value" for --set-header.
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

// Every option, once: the command-line parser, the YAML loader and the help
// text all read this table, so a flag cannot exist in one and not the others.
struct Option {
  std::string_view key;      // canonical name: the long flag without dashes
  std::string_view alias;    // a second long name (the Python proxies' plural forms)
  char short_name;           // 0 when there is none
  bool list;                 // takes one or more values (argparse nargs="+")
  bool cli_only;             // meaningless in a config file
  std::string_view group;    // help section
  std::string_view metavar;  // value placeholder in the help
  std::string_view help;     // one line, ends with the default when there is one
  Apply apply = nullptr;     // sets one value; nullptr: read by apply_raw (lists, engines)
  // Read once at start (a listener, a thread count, a connection pool's
  // shape): a reload names a change but leaves the running value.
  bool restart = false;
  bool repeatable = false;  // given again on the command line, adds values (no replacing)
};

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
           "Address to listen on for clients (default: 0.0.0.0).", &set_host, kRestart},
    Option{"port", "", 0, false, false, kListener, "PORT",
           "Port to listen on; 0 picks a free one (default: 8000).", &set_port, kRestart},
    Option{"workers", "", 0, false, false, kListener, "N",
           "Worker threads, at most 1024; 0 means one per CPU core (default: 0).",
           &set_uint<&Config::workers, 1024>, kRestart},
    Option{"tls-cert", "", 0, false, false, kListener, "FILE",
           "Serve clients over TLS with this PEM certificate (its chain after it); re-read "
           "on SIGHUP (default: none, plain HTTP).",
           &set_trimmed<&Config::tls_cert>, kRestart},
    Option{"tls-key", "", 0, false, false, kListener, "FILE",
           "The PEM private key of --tls-cert; re-read on SIGHUP (default: none).",
           &set_trimmed<&Config::tls_key>, kRestart},
    Option{"tls-client-ca", "", 0, false, false, kListener, "FILE",
           "Require client certificates signed by a CA in this PEM file (mutual TLS); "
           "re-read on SIGHUP (default: none, no client certificate asked).",
           &set_trimmed<&Config::tls_client_ca>, kRestart},
    Option{"tls-min-version", "", 0, false, false, kListener, "1.2|1.3",
           "Oldest TLS version clients may use (default: 1.2).", &set_tls_version, kRestart},

    Option{"model", "", 'm', false, false, kEngines, "NAME",
           "Model name, as the demo proxy's --model; optional (default: none).",
           &set_text<&Config::model>, kRestart},
    Option{"prefill", "", 'p', true, false, kEngines, "HOST:PORT",
           "Demo-proxy form: prefill instances, one or more (default: none)."},
    Option{"decode", "", 'd', true, false, kEngines, "HOST:PORT",
           "Demo-proxy form: decode instances, one or more (default: none)."},
    Option{"prefiller-host", "prefiller-hosts", 0, true, false, kEngines, "HOST",
           "Multi-turn form: prefill hosts, paired with --prefiller-port (default: localhost)."},
    Option{"prefiller-port", "prefiller-ports", 0, true, false, kEngines, "PORT",
           "Multi-turn form: prefill ports, one per host (default: 8100)."},
    Option{"decoder-host", "decoder-hosts", 0, true, false, kEngines, "HOST",
           "Multi-turn form: decode hosts, paired with --decoder-port (default: localhost)."},
    Option{"decoder-port", "decoder-ports", 0, true, false, kEngines, "PORT",
           "Multi-turn form: decode ports, one per host (default: 8200)."},
    Option{"encode-servers-urls", "", 0, false, false, kEngines, "URL,URL",
           "EPD form: comma-separated encoder URLs for multimodal items (default: none)."},
    Option{"prefill-servers-urls", "", 0, false, false, kEngines, "URL,URL|disable",
           "EPD form: comma-separated prefill URLs; disable, none or \"\" sends each request "
           "in one hop to a combined P+D instance (default: none)."},
    Option{"decode-servers-urls", "", 0, false, false, kEngines, "URL,URL",
           "EPD form: comma-separated decode URLs (default: none)."},
    Option{"kv-connector", "", 0, false, false, kEngines, "nixl|p2p-nccl|lmcache|none",
           "How prefill hands KV blocks to decode; none sends one hop (default: nixl).",
           &set_kv_connector, kRestart},
    Option{"kv-events", "", 0, true, false, kEngines,
           "INSTANCE=tcp://HOST:PORT[,replay=tcp://HOST:PORT]",
           "Where an instance publishes its KV-cache events (vLLM's --kv-events-config "
           "endpoint, and its replay endpoint): pdgate then knows exactly which prefixes it "
           "holds (docs/kv-events.md); repeat the flag for more instances (default: none).",
           nullptr, false, true},
    Option{"kv-events-replay-timeout", "", 0, false, false, kEngines, "DURATION",
           "Time a replay of missed KV events may take before the instance falls back to the "
           "approximate index (default: 2s).",
           &set_duration<&Config::kv_events_replay_timeout>, kRestart},
    Option{"kv-index-blocks-per-instance", "", 0, false, false, kEngines, "N",
           "KV blocks the exact index keeps per instance; more are dropped and counted "
           "(default: 262144).",
           &set_uint<&Config::kv_index_blocks_per_instance, (1u << 30)>, kRestart},
    Option{"kv-index-max-blocks", "", 0, false, false, kEngines, "N",
           "KV blocks the exact index keeps in all (default: 2000000).",
           &set_uint<&Config::kv_index_max_blocks, (1u << 31)>, kRestart},

    Option{"max-body-size", "", 0, false, false, kLimits, "SIZE",
           "Largest request body accepted; bytes or K/KiB/M/MiB/G/GiB (default: 64MiB).",
           &set_size<&Config::max_body_bytes>},
    Option{"max-header-size", "", 0, false, false, kLimits, "SIZE",
           "Largest request header block accepted (default: 64KiB).",
           &set_size<&Config::max_header_bytes>},
    Option{"body-memory-limit", "", 0, false, false, kLimits, "SIZE",
           "Memory all request bodies being received may hold together; past it a large "
           "body is refused with 503 (default: 1GiB).",
           &set_size<&Config::body_memory_limit>},
    Option{"header-timeout", "", 0, false, false, kLimits, "DURATION",
           "Time allowed to receive a request's headers; 500ms, 10s, 2m or seconds "
           "(default: 10s).",
           &set_duration<&Config::header_timeout>},
    Option{"client-idle-timeout", "", 0, false, false, kLimits, "DURATION",
           "Idle keep-alive client connections are closed after this (default: 75s).",
           &set_duration<&Config::client_idle_timeout>},
    Option{"api-keys", "", 0, false, false, kLimits, "FILE",
           "YAML file of client API keys (SHA-256 hashed) with optional limits; clients must "
           "send 'Authorization: Bearer KEY' (default: none, no key asked).",
           &set_trimmed<&Config::api_keys_file>, kRestart},
    Option{"api-keys-from-redis", "", 0, false, false, kLimits, "true|false",
           "Also read API keys from the Redis hash PREFIXapi_keys (hex SHA-256 -> JSON), "
           "refreshed every 5s; needs --redis (default: false).",
           &set_switch<&Config::api_keys_from_redis>, kRestart},
    Option{"limits-on-redis-failure", "", 0, false, false, kLimits, "open|closed",
           "When Redis cannot answer a limit check: let the request in (open) or answer 503 "
           "(closed) (default: open).",
           &set_fail_mode, kRestart},

    Option{"connect-timeout", "", 0, false, false, kUpstream, "DURATION",
           "Time allowed to connect to an engine (default: 5s).",
           &set_duration<&Config::connect_timeout>},
    Option{"first-byte-timeout", "", 0, false, false, kUpstream, "DURATION",
           "Time allowed for an engine's first response byte, prefill included, and "
           "for each silence inside its response (default: 600s).",
           &set_duration<&Config::first_byte_timeout>},
    Option{"upstream-idle-timeout", "", 0, false, false, kUpstream, "DURATION",
           "Idle keep-alive connections to engines are closed after this "
           "(default: 60s).",
           &set_duration<&Config::upstream_idle_timeout>, kRestart},
    Option{"upstream-max-idle", "", 0, false, false, kUpstream, "N",
           "Idle keep-alive connections kept per engine per worker (default: 64).",
           &set_uint<&Config::upstream_max_idle, (1u << 20)>, kRestart},
    Option{"upstream-ca", "", 0, false, false, kUpstream, "FILE",
           "PEM CA bundle that https:// engines' certificates must chain to (default: the "
           "system's CA store).",
           &set_trimmed<&Config::upstream_ca>, kRestart},
    Option{"upstream-cert", "", 0, false, false, kUpstream, "FILE",
           "PEM client certificate presented to https:// engines (mutual TLS) (default: "
           "none).",
           &set_trimmed<&Config::upstream_cert>, kRestart},
    Option{"upstream-key", "", 0, false, false, kUpstream, "FILE",
           "The PEM private key of --upstream-cert (default: none).",
           &set_trimmed<&Config::upstream_key>, kRestart},
    Option{"upstream-insecure", "", 0, false, false, kUpstream, "true|false",
           "Do not verify https:// engines' certificates or names; for testing only "
           "(default: false).",
           &set_switch<&Config::upstream_insecure>, kRestart},

    Option{"policy", "", 0, false, false, kPolicies, "NAME|PATH",
           "Routing policy for every stage: round_robin, least_load, power_of_two, "
           "session_affinity, prefix_affinity, cache_aware, kv_aware, conversation_decode, "
           "conditional_pd, or a .lua file "
           "(default: round_robin).",
           &set_name<&Config::policy>},
    Option{"policy-prefill", "", 0, false, false, kPolicies, "NAME|PATH",
           "Policy for the prefill stage (default: --policy).", &set_name<&Config::policy_prefill>},
    Option{"policy-decode", "", 0, false, false, kPolicies, "NAME|PATH",
           "Policy for the decode stage (default: --policy).", &set_name<&Config::policy_decode>},
    Option{"policy-encode", "", 0, false, false, kPolicies, "NAME|PATH",
           "Policy for the encode stage (default: --policy).", &set_name<&Config::policy_encode>},
    Option{"policy-dir", "", 0, false, false, kPolicies, "DIR",
           "Directory searched for NAME.lua before the shipped policies (default: none).",
           &set_name<&Config::policy_dir>},
    Option{"policy-budget-us", "", 0, false, false, kPolicies, "N",
           "Time a policy hook may run, in microseconds; past it the request is routed "
           "round-robin (default: 1000).",
           &set_policy_budget},
    Option{"policy-memory", "", 0, false, false, kPolicies, "SIZE",
           "Memory each worker's policy state may hold (default: 64MiB).",
           &set_size<&Config::policy_memory>},
    Option{"prefix-block-size", "", 0, false, false, kPolicies, "SIZE",
           "Prompt bytes per prefix block hash that policies compare (default: 256).",
           &set_size<&Config::prefix_block_size>},
    Option{"policy-poll-interval", "", 0, false, false, kPolicies, "DURATION",
           "How often policy files are checked for changes and reloaded (default: 1s).",
           &set_duration<&Config::policy_poll_interval>, kRestart},
    Option{"metrics-interval", "", 0, false, false, kPolicies, "DURATION|off",
           "How often each engine's /metrics is scraped for policies; off disables "
           "(default: 1s).",
           &set_interval<&Config::metrics_interval>, kRestart},
    Option{"tokenizer", "", 0, false, false, kPolicies, "sim|vllm|none",
           "How a request becomes token ids for the exact KV index (pdgate.cached_tokens(), "
           "docs/kv-events.md): sim applies pdgate-sim's rule (tests, demos); vllm asks a decode "
           "engine's POST /tokenize before routing (exact for any model, one round trip); none "
           "gives policies no exact data (default: none).",
           &set_tokenizer, kRestart},
    Option{"tokenizer-timeout", "", 0, false, false, kPolicies, "DURATION",
           "How long --tokenizer vllm waits for /tokenize; past it the request is routed without "
           "exact data (default: 1s).",
           &set_duration<&Config::tokenizer_timeout>},

    Option{"dns-interval", "", 0, false, false, kEngines, "DURATION",
           "How often dns://NAME:PORT instance sources are resolved again (default: 5s).",
           &set_duration<&Config::dns_interval>, kRestart},
    Option{"dns-server", "", 0, false, false, kEngines, "HOST:PORT",
           "DNS server asked for dns:// sources (default: the first nameserver of "
           "/etc/resolv.conf, port 53).",
           &set_trimmed<&Config::dns_server>, kRestart},
    Option{"redis", "", 0, false, false, kGeneral, "URL",
           "Conversation store for multi-turn KV reuse shared by replicas: "
           "redis://[:password@]host:port[/db], "
           "redis+sentinel://[:password@]host:port[,host:port...]/master[/db] "
           "or unix:///path; percent-escapes in the user and password are decoded (an @ in "
           "a password is %40) (default: in memory).",
           &set_trimmed<&Config::redis_url>, kRestart},
    Option{"redis-key-prefix", "", 0, false, false, kGeneral, "PREFIX",
           "Prefix of the Redis keys (default: pdgate:).", &set_text<&Config::redis_key_prefix>,
           kRestart},
    Option{"redis-timeout", "", 0, false, false, kGeneral, "DURATION",
           "Longest wait for Redis before a turn proceeds as a cache miss (default: 50ms).",
           &set_duration<&Config::redis_timeout>, kRestart},
    Option{"shared-kv-index", "", 0, false, false, kGeneral, "on|off",
           "With --redis, replicas share where they routed each prompt prefix and "
           "conversation, so prefix and conversation policies see the whole cluster's "
           "routing (default: on).",
           &set_switch<&Config::shared_kv_index>, kRestart},
    Option{"conversation-ttl", "", 0, false, false, kGeneral, "DURATION",
           "How long a conversation's decode blocks stay reusable (default: 450s).",
           &set_duration<&Config::conversation_ttl>},
    Option{"conversation-cache-size", "", 0, false, false, kGeneral, "N",
           "Conversations the in-memory store keeps (default: 100000).",
           &set_uint<&Config::conversation_cache_size, (1u << 30)>, kRestart},
    Option{"conversation-scope-header", "", 0, false, false, kGeneral, "NAME",
           "Header whose value decides whose conversations a request may continue, e.g. "
           "x-tenant-id (default: the Authorization credential).",
           &set_scope_header},
    Option{"expose-kv-params", "", 0, false, false, kGeneral, "true|false",
           "Let clients see decode's kv_transfer_params (default: false).", &set_expose_kv_params},
    Option{"verbose-errors", "", 0, false, false, kGeneral, "true|false",
           "Error bodies sent to clients include engine addresses and engines' own error "
           "text; otherwise only the stage that failed and how (default: false).",
           &set_switch<&Config::verbose_errors>},
    Option{"profile-routes", "", 0, false, false, kGeneral, "on|off",
           "Serve POST /start_profile and /stop_profile on the client port (they need the "
           "admin key when one is set) (default: on).",
           &set_switch<&Config::profile_routes>, kRestart},
    Option{"admin-port", "", 0, false, false, kGeneral, "PORT",
           "Port of the admin API (docs/admin.md); 0 picks a free one (default: off).",
           &set_admin_port, kRestart},
    Option{"admin-host", "", 0, false, false, kGeneral, "HOST",
           "Address the admin API listens on (default: 127.0.0.1).",
           &set_trimmed<&Config::admin_host>, kRestart},
    Option{"admin-key-file", "", 0, false, false, kGeneral, "FILE",
           "File holding the admin API key (default: env ADMIN_API_KEY).",
           &set_trimmed<&Config::admin_key_file>, kRestart},
    Option{"model-check-timeout", "", 0, false, false, kGeneral, "DURATION",
           "Time an instance added at run time has to answer GET /v1/models when --model "
           "is set, and to resolve for --allowed-upstreams (default: 5s).",
           &set_duration<&Config::model_check_timeout>, kRestart},
    Option{"shutdown-timeout", "", 0, false, false, kGeneral, "DURATION",
           "On SIGTERM or SIGINT, time in-flight requests have to finish before pdgate "
           "exits anyway (default: 30s).",
           &set_duration<&Config::shutdown_timeout>, kRestart},
    Option{"allowed-upstreams", "", 0, true, false, kGeneral, "CIDR",
           "Networks instances added at run time (admin API, Redis) must be in, e.g. "
           "10.0.0.0/8 (default: any).",
           nullptr, kRestart},
    Option{"health-interval", "", 0, false, false, kGeneral, "DURATION|off",
           "How often each instance's /health is checked (default: 2s).",
           &set_interval<&Config::health_interval>, kRestart},
    Option{"health-rise", "", 0, false, false, kGeneral, "N",
           "Passed checks that re-admit an ejected instance (default: 2).",
           &set_count<&Config::health_rise>, kRestart},
    Option{"health-fall", "", 0, false, false, kGeneral, "N",
           "Failed checks that eject an instance (default: 2).", &set_count<&Config::health_fall>,
           kRestart},
    Option{"health-max-concurrency", "", 0, false, false, kGeneral, "N",
           "Health checks in flight at most, spread over the interval; also bounds the "
           "/metrics scrapes and the validation of instances learnt through Redis "
           "(default: 64).",
           &set_count<&Config::health_max_concurrency>, kRestart},
    Option{"eject-after", "", 0, false, false, kGeneral, "N",
           "Consecutive request failures (connect, timeout, 5xx) that eject an instance "
           "(default: 3).",
           &set_count<&Config::eject_after>},
    Option{"retry-budget", "", 0, false, false, kGeneral, "FRACTION",
           "Retries in flight allowed, as a fraction of requests in flight (default: 0.2).",
           &set_fraction<&Config::retry_budget>},
    Option{"otlp-endpoint", "", 0, false, false, kTracing, "URL",
           "Where spans are exported over OTLP/HTTP (JSON), e.g. http://collector:4318 "
           "(path default /v1/traces; http:// only) (default: none, no spans).",
           &set_otlp_endpoint, kRestart},
    Option{"trace-sample-ratio", "", 0, false, false, kTracing, "FRACTION",
           "Fraction of the traces pdgate starts that are sampled; a client's traceparent "
           "decides its own (default: 1).",
           &set_fraction<&Config::trace_sample_ratio>},
    Option{"otlp-batch-size", "", 0, false, false, kTracing, "N",
           "Spans per export request at most (default: 512).",
           &set_uint<&Config::otlp_batch_size, 100000>, kRestart},
    Option{"otlp-export-interval", "", 0, false, false, kTracing, "DURATION",
           "Longest time a finished span waits before it is exported (default: 1s).",
           &set_duration<&Config::otlp_export_interval>, kRestart},
    Option{"otlp-queue-size", "", 0, false, false, kTracing, "N",
           "Finished spans waiting for export at most; more are dropped and counted in "
           "pdgate_trace_spans_dropped_total (default: 8192).",
           &set_uint<&Config::otlp_queue_size, (1u << 24)>, kRestart},
    Option{"otlp-timeout", "", 0, false, false, kTracing, "DURATION",
           "Time one export request may take, connecting included (default: 5s).",
           &set_duration<&Config::otlp_timeout>, kRestart},
    Option{"forward-headers", "", 0, true, false, kTracing, "NAME,NAME",
           "Client request headers passed on to the engines when present, e.g. "
           "x-tenant-id,x-priority (default: none)."},
    Option{"set-header", "", 0, true, false, kTracing, "'NAME: VALUE'",
           "A header every engine request carries; repeat the flag for more (default: none).",
           nullptr, false, true},
    Option{"log-level", "", 0, false, false, kGeneral, "LEVEL",
           "trace, debug, info, warn or error (default: info).", &set_log_level},
    Option{"access-log", "", 0, false, false, kGeneral, "PATH|stderr|off",
           "One line per completion request (status, instances, TTFT, tokens, ...) appended to "
           "PATH, or "
           "written to stderr; written by a background thread, lines dropped and counted "
           "when it cannot keep up (default: off).",
           &set_access_log, kRestart},
    Option{"access-log-format", "", 0, false, false, kGeneral, "text|json",
           "Access log lines as key=value text or as one JSON object each (default: text).",
           &set_access_log_format, kRestart},
    Option{"config", "", 0, false, true, kGeneral, "FILE",
           "YAML file with any of these options (names without dashes); flags override it. "
           "SIGHUP re-reads it and applies what can change without a restart."},
    Option{"help", "", 'h', false, true, kGeneral, "", "Print this help and exit."},
    Option{"version", "", 'V', false, true, kGeneral, "", "Print the version and exit."},
    Option{"check-config", "", 0, false, true, kGeneral, "",
           "Check the flags, the --config file and the policy scripts, then exit: 0 when "
           "valid, 1 with every error otherwise (nothing is resolved or contacted)."},
};

// '_' and '-' are interchangeable in names, as in vLLM's own CLI, so
// `max_body_size` in YAML and `--max-body-size` mean the same thing.
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

// Labels and weight given with one instance in a YAML list.
struct InstanceMeta {
  std::map<std::string, std::string> labels;
  unsigned weight = 1;
  KvEventsEndpoint kv_events;
};

// The values given for one option, and where they came from (the flag as
// the user spelled it, or the config key) so errors point at the culprit.
// `meta`, when not empty, holds one entry per value (YAML instance lists).
struct RawValue {
  std::string origin;
  std::vector<std::string> values;
  std::vector<InstanceMeta> meta;
};
using RawMap = std::map<std::string, RawValue, std::less<>>;
// Mistakes found so far: parsing goes on after one, so that every mistake
// is reported at once.
using Errors = std::vector<std::string>;

// The EPD proxy's list syntax: comma-separated, whitespace trimmed, empty
// items dropped.
std::vector<std::string> split_urls(std::string_view text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos)
      comma = text.size();
    const std::string_view item = trim(text.substr(pos, comma - pos));
    if (!item.empty())
      out.emplace_back(item);
    pos = comma + 1;
  }
  return out;
}

// An EPD option's items split at commas; an item that carries labels or a
// weight must be a single URL, which keeps them.
RawValue split_epd(const RawValue& v) {
  RawValue split{v.origin, {}, {}};
  for (std::size_t k = 0; k < v.values.size(); ++k) {
    for (auto& u : split_urls(v.values[k])) {
      split.values.push_back(std::move(u));
      if (!v.meta.empty())
        split.meta.push_back(v.meta[k]);
    }
  }
  return split;
}

// Builds a Config from collected option values on top of `c`, adding a
// message to `errors` for each bad value (which leaves its option as it
// was). Used for the YAML file, the command line and both merged, so all
// share the rules.
Config apply_raw(Config c, const RawMap& raw, Errors& errors) {
  const auto get = [&](std::string_view key) -> const RawValue* {
    const auto it = raw.find(key);
    return it == raw.end() ? nullptr : &it->second;
  };
  const auto err = [&](const RawValue& v, const std::string& what) {
    errors.push_back(v.origin + ": " + what);
  };

  // Engines: every form contributes to the same lists, in the order demo,
  // multi-turn, EPD. A role's list is replaced only when some form names it.
  // dns:// entries, by role; a role named anywhere replaces its sources.
  std::vector<DnsSource> dns[4];
  const auto parse_list = [&](const RawValue& v, Role role, std::vector<UpstreamSpec>& out) {
    for (std::size_t k = 0; k < v.values.size(); ++k) {
      const std::string& text = v.values[k];
      if (lower(trim(text).substr(0, 6)) == "dns://") {
        if (auto d = parse_dns_source(role, trim(text)))
          dns[static_cast<int>(role)].push_back(std::move(*d));
        else
          err(v, d.error());
        continue;
      }
      auto u = parse_upstream(role, text);
      if (!u) {
        err(v, u.error());
        continue;
      }
      if (k < v.meta.size()) {
        u->labels = v.meta[k].labels;
        u->weight = v.meta[k].weight;
        u->kv_events = v.meta[k].kv_events;
      }
      out.push_back(std::move(*u));
    }
  };
  std::vector<UpstreamSpec> prefill, decode, encode;
  bool prefill_named = false, decode_named = false, encode_named = false;
  if (const auto* v = get("prefill")) {
    parse_list(*v, Role::prefill, prefill);
    prefill_named = true;
  }
  if (const auto* v = get("decode")) {
    parse_list(*v, Role::decode, decode);
    decode_named = true;
  }

  // EPD form, parsed before the multi-turn defaults so that those apply
  // only when no other form gave the role's instances.
  std::vector<UpstreamSpec> epd_prefill, epd_decode;
  if (const auto* v = get("encode-servers-urls")) {
    parse_list(split_epd(*v), Role::encode, encode);
    encode_named = true;
  }
  if (const auto* v = get("decode-servers-urls")) {
    parse_list(split_epd(*v), Role::decode, epd_decode);
    decode_named = true;
  }
  if (const auto* v = get("prefill-servers-urls")) {
    const RawValue split = split_epd(*v);
    // Like the EPD proxy, "disable", "none" or nothing at all means E+PD:
    // no prefill stage, one hop to a combined instance.
    const std::string word = v->values.size() == 1 ? lower(trim(v->values.front())) : "";
    if (word == "disable" || word == "none" || split.values.empty()) {
      c.prefill_disabled = true;
    } else {
      c.prefill_disabled = false;
      parse_list(split, Role::prefill, epd_prefill);
      prefill_named = true;
    }
  }

  // Multi-turn form: hosts and ports given separately, zipped pairwise, with
  // the Python proxy's defaults for whichever side was left out.
  const auto* ph = get("prefiller-host");
  const auto* pp = get("prefiller-port");
  const auto* dh = get("decoder-host");
  const auto* dp = get("decoder-port");
  std::vector<UpstreamSpec> mt_prefill, mt_decode;
  if (ph != nullptr || pp != nullptr || dh != nullptr || dp != nullptr) {
    const auto zip = [&](const RawValue* hosts, const RawValue* ports, std::string_view def_port,
                         Role role, std::string_view side, std::vector<UpstreamSpec>& out) {
      const std::vector<std::string> def_hosts{"localhost"};
      const std::vector<std::string> def_ports{std::string(def_port)};
      const auto& hv = hosts != nullptr ? hosts->values : def_hosts;
      const auto& pv = ports != nullptr ? ports->values : def_ports;
      if (hv.size() != pv.size()) {
        errors.push_back("Number of " + std::string(side) + " hosts must match ports (" +
                         std::to_string(hv.size()) + " hosts, " + std::to_string(pv.size()) +
                         " ports)");
        return;
      }
      // Errors name the flag that supplied the bad item; defaults are valid.
      const RawValue defaults{"--" + std::string(side) + "-host", {}, {}};
      const RawValue& host_origin = hosts != nullptr ? *hosts : defaults;
      const RawValue& port_origin = ports != nullptr ? *ports : defaults;
      for (std::size_t i = 0; i < hv.size(); ++i) {
        const std::string_view host = trim(hv[i]);
        if (host.empty()) {
          err(host_origin, "empty host");
          continue;
        }
        auto port = parse_port(trim(pv[i]), false);
        if (!port) {
          err(port_origin, port.error());
          continue;
        }
        // "::1" and "[::1]" both name an IPv6 host.
        const std::string_view bare =
            host.starts_with('[') && host.ends_with(']') ? host.substr(1, host.size() - 2) : host;
        auto u = parse_upstream(role, host_port(bare, *port));
        if (!u) {
          err(host_origin, u.error());
          continue;
        }
        out.push_back(std::move(*u));
      }
    };
    if (ph != nullptr || pp != nullptr ||
        (prefill.empty() && epd_prefill.empty() && !c.prefill_disabled)) {
      zip(ph, pp, "8100", Role::prefill, "prefiller", mt_prefill);
      prefill_named = true;
    }
    if (dh != nullptr || dp != nullptr || (decode.empty() && epd_decode.empty())) {
      zip(dh, dp, "8200", Role::decode, "decoder", mt_decode);
      decode_named = true;
    }
  }

  if (prefill_named) {
    prefill.insert(prefill.end(), mt_prefill.begin(), mt_prefill.end());
    prefill.insert(prefill.end(), epd_prefill.begin(), epd_prefill.end());
    c.prefill = std::move(prefill);
  }
  if (decode_named) {
    decode.insert(decode.end(), mt_decode.begin(), mt_decode.end());
    decode.insert(decode.end(), epd_decode.begin(), epd_decode.end());
    c.decode = std::move(decode);
  }
  if (encode_named)
    c.encode = std::move(encode);
  for (Role role : {Role::prefill, Role::decode, Role::encode}) {
    const bool named = role == Role::prefill  ? prefill_named
                       : role == Role::decode ? decode_named
                                              : encode_named;
    if (!named)
      continue;
    std::erase_if(c.dns_sources, [&](const DnsSource& d) { return d.role == role; });
    for (auto& d : dns[static_cast<int>(role)])
      c.dns_sources.push_back(std::move(d));
  }

  // Every single-valued option, through its entry's setter.
  for (const auto& o : kOptions) {
    if (o.apply == nullptr)
      continue;
    if (const auto* v = get(o.key)) {
      if (v->values.size() != 1) {
        err(*v, "expects exactly one value");
        continue;
      }
      if (auto r = o.apply(c, v->values.front()); !r)
        err(*v, r.error());
    }
  }
  if (const auto* v = get("forward-headers")) {
    c.forward_headers.clear();
    for (const auto& item : v->values) {
      for (auto& h : split_urls(item)) {
        auto name = extra_header_name(h);
        if (!name) {
          err(*v, name.error());
          continue;
        }
        if (std::find(c.forward_headers.begin(), c.forward_headers.end(), *name) ==
            c.forward_headers.end())
          c.forward_headers.push_back(std::move(*name));
      }
    }
  }
  if (const auto* v = get("set-header")) {
    c.set_headers.clear();
    for (const auto& item : v->values) {
      auto h = parse_set_header(item);
      if (!h) {
        err(*v, h.error());
        continue;
      }
      c.set_headers.push_back(std::move(*h));
    }
  }
  if (const auto* v = get("allowed-upstreams")) {
    c.allowed_upstreams.clear();
    for (const auto& item : v->values) {
      for (auto& u : split_urls(item))
        c.allowed_upstreams.push_back(std::move(u));
    }
  }
  // After the instance lists: each names an instance given in one of them.
  if (const auto* v = get("kv-events")) {
    for (const auto& item : v->values) {
      auto ev = parse_kv_events_flag(item);
      if (!ev) {
        err(*v, ev.error());
        continue;
      }
      bool found = false;
      for (auto* list : {&c.prefill, &c.decode, &c.encode}) {
        for (auto& u : *list) {
          if (u.url == ev->first) {
            u.kv_events = ev->second;
            found = true;
          }
        }
      }
      if (!found)
        err(*v,
            "no instance " + ev->first + " is configured (give it with --prefill, --decode, ...)");
    }
  }
  return c;
}

// An instance's kv_events in YAML: {endpoint: URL, replay_endpoint: URL},
// or the endpoint alone as a string.
Result<KvEventsEndpoint> yaml_kv_events(const YAML::Node& value) {
  KvEventsEndpoint ev;
  if (value.IsScalar()) {
    ev.endpoint = value.Scalar();
  } else if (value.IsMap()) {
    for (const auto& f : value) {
      const std::string key = f.first.IsScalar() ? f.first.Scalar() : std::string();
      if (!f.second.IsScalar())
        return fail("'" + key + "' must be a plain string");
      if (key == "endpoint")
        ev.endpoint = f.second.Scalar();
      else if (key == "replay_endpoint" || key == "replay-endpoint")
        ev.replay = f.second.Scalar();
      else
        return fail("unknown field '" + key + "' (expected endpoint, replay_endpoint)");
    }
  } else {
    return fail("expected {endpoint, replay_endpoint} or an endpoint");
  }
  return check_kv_events_endpoint(std::move(ev));
}

// Reads one instance given as a mapping: {url: ..., labels: {k: v},
// weight: N}. Returns the URL; adds to `errors` and returns nothing when
// the item is malformed.
std::optional<std::string> yaml_instance(const YAML::Node& item, const std::string& origin,
                                         InstanceMeta& meta, Errors& errors) {
  std::optional<std::string> url;
  bool ok = true;
  for (const auto& field : item) {
    const std::string name = field.first.IsScalar() ? field.first.Scalar() : std::string();
    const YAML::Node& value = field.second;
    if (name == "url") {
      if (!value.IsScalar()) {
        errors.push_back(origin + ": an instance's url must be a plain string");
        ok = false;
      } else {
        url = value.Scalar();
      }
    } else if (name == "labels") {
      if (!value.IsMap()) {
        errors.push_back(origin + ": an instance's labels must be a mapping of strings");
        ok = false;
        continue;
      }
      for (const auto& l : value) {
        if (!l.first.IsScalar() || !l.second.IsScalar()) {
          errors.push_back(origin + ": label names and values must be plain strings");
          ok = false;
          break;
        }
        meta.labels[l.first.Scalar()] = l.second.Scalar();
      }
    } else if (name == "weight") {
      auto w = value.IsScalar() ? parse_uint(trim(value.Scalar()), 1000)
                                : Result<std::uint64_t>(fail("not a number"));
      if (!w || *w == 0) {
        errors.push_back(origin + ": an instance's weight must be an integer from 1 to 1000");
        ok = false;
      } else {
        meta.weight = static_cast<unsigned>(*w);
      }
    } else if (name == "kv_events" || name == "kv-events") {
      auto ev = yaml_kv_events(value);
      if (!ev) {
        errors.push_back(origin + ": kv_events: " + ev.error());
        ok = false;
      } else {
        meta.kv_events = std::move(*ev);
      }
    } else {
      errors.push_back(origin + ": unknown instance field '" + name +
                       "' (expected url, labels, weight, kv_events)");
      ok = false;
    }
  }
  if (!url) {
    if (ok)
      errors.push_back(origin + ": an instance given as a mapping needs a url");
    return std::nullopt;
  }
  if (!ok)
    return std::nullopt;
  return url;
}

bool takes_instances(const Option& o) {
  return o.key == "prefill" || o.key == "decode" || o.key.ends_with("-servers-urls");
}

// Reads a YAML document into option values. `label` names the source in
// errors ("config file 'x.yaml'"). A bad key is reported and skipped.
RawMap yaml_to_raw(const std::string& yaml_text, const std::string& label, Errors& errors) {
  RawMap raw;
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsDefined() || root.IsNull())
      return raw;
    if (!root.IsMap()) {
      errors.push_back(label + ": expected a mapping of option names to values");
      return raw;
    }
    for (const auto& kv : root) {
      if (!kv.first.IsScalar()) {
        errors.push_back(label + ": option names must be plain strings");
        continue;
      }
      const std::string name = kv.first.Scalar();
      const Option* o = find_option(name);
      if (o == nullptr) {
        errors.push_back(label + ": unknown key '" + name + "' (see --help for the option names)");
        continue;
      }
      if (o->cli_only) {
        errors.push_back(label + ": '" + name + "' can only be given on the command line");
        continue;
      }
      RawValue v{label + ", key '" + name + "'", {}, {}};
      const YAML::Node& node = kv.second;
      if (node.IsNull())
        continue;  // `key:` with nothing after it leaves the default
      if (node.IsScalar()) {
        v.values.push_back(node.Scalar());
      } else if (node.IsSequence()) {
        bool bad = false;
        bool any_meta = false;
        std::vector<InstanceMeta> meta;
        for (const auto& item : node) {
          InstanceMeta m;
          if (item.IsMap() && takes_instances(*o)) {
            auto url = yaml_instance(item, v.origin, m, errors);
            if (!url) {
              bad = true;
              continue;
            }
            v.values.push_back(*url);
            any_meta = true;
          } else if (!item.IsScalar()) {
            errors.push_back(v.origin +
                             (takes_instances(*o)
                                  ? ": list items must be addresses or {url, labels, weight}"
                                  : ": list items must be plain values"));
            bad = true;
            continue;
          } else {
            v.values.push_back(item.Scalar());
          }
          meta.push_back(std::move(m));
        }
        // A bad item is reported and left out; the others still count,
        // so the rules that look at the whole list report what they find.
        if (bad && v.values.empty())
          continue;
        if (any_meta)
          v.meta = std::move(meta);
        // The EPD keys hold comma-separated text on the command line; a YAML
        // list of URLs is the natural spelling in a file, so join it (a
        // list with labels keeps its items apart: each is one URL).
        if (o->key.ends_with("-servers-urls")) {
          if (!any_meta) {
            std::string joined;
            for (const auto& item : v.values)
              joined += (joined.empty() ? "" : ",") + item;
            v.values = {joined};
          }
        } else if (!o->list) {
          errors.push_back(v.origin + ": expects a single value, not a list");
          continue;
        } else if (v.values.empty()) {
          errors.push_back(v.origin + ": the list must not be empty");
          continue;
        }
      } else {
        errors.push_back(v.origin + ": expects a value or a list, not a mapping");
        continue;
      }
      raw[std::string(o->key)] = std::move(v);
    }
  } catch (const YAML::Exception& e) {
    errors.push_back(label + ": " + e.what());
  }
  return raw;
}

// Every message, a line each.
Failure fail_all(const Errors& errors) {
  std::string out;
  for (const auto& e : errors)
    out += (out.empty() ? "" : "\n") + e;
  return fail(out);
}

bool looks_like_option(std::string_view tok) {
  if (tok.size() > 2 && tok.starts_with("--"))
    return true;
  return tok.size() >= 2 && tok[0] == '-' && std::isalpha(static_cast<unsigned char>(tok[1])) != 0;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return fail("--config: cannot read '" + path + "': " + std::generic_category().message(errno));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad())
    return fail("--config: error reading '" + path + "'");
  return ss.str();
}

}  // namespace

Result<KvEventsEndpoint> check_kv_events_endpoint(KvEventsEndpoint ev) {
  auto endpoint = parse_zmq_endpoint(ev.endpoint);
  if (!endpoint)
    return fail(endpoint.error());
  ev.endpoint = *endpoint;
  if (!trim(ev.replay).empty()) {
    auto replay = parse_zmq_endpoint(ev.replay);
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
    return bad("expected http://host[:port][/path]");
  if (u->scheme != "http")
    return bad("only http:// is supported");
  if (u->query || u->fragment)
    return bad("queries and fragments are not supported");
  if (u->has_userinfo)
    return bad("user info is not supported");
  const UrlHost& h = u->hosts.front();
  if (h.host.empty())
    return bad("missing host");
  HttpEndpoint e;
  e.host = h.host;
  e.port = h.port.value_or(80);
  e.target = u->path.empty() || u->path == "/" ? std::string(default_target) : u->path;
  return e;
}

Result<Config> apply_yaml(Config base, const std::string& yaml_text) {
  Errors errors;
  auto raw = yaml_to_raw(yaml_text, "config", errors);
  auto c = apply_raw(std::move(base), raw, errors);
  if (!errors.empty())
    return fail_all(errors);
  return c;
}

Result<CommandLine> parse_command_line(int argc, const char* const* argv) {
  CommandLine cl;
  // Help wins over every other mistake, so `pdgate --typo --help` helps.
  for (int i = 1; i < argc; ++i) {
    const std::string_view tok = argv[i] == nullptr ? "" : argv[i];
    if (tok == "-h" || tok == "--help") {
      cl.help = true;
      return cl;
    }
  }

  Errors errors;
  RawMap flags;
  std::string config_path;
  bool config_given = false;
  int i = 1;
  while (i < argc) {
    const std::string tok = argv[i] == nullptr ? "" : argv[i];
    ++i;
    const Option* o = nullptr;
    std::optional<std::string> inline_value;
    std::string spelled;
    if (tok.size() > 2 && tok.starts_with("--")) {
      const std::size_t eq = tok.find('=');
      spelled = tok.substr(0, eq);
      if (eq != std::string::npos)
        inline_value = tok.substr(eq + 1);
      o = find_option(std::string_view(spelled).substr(2));
    } else if (looks_like_option(tok)) {
      spelled = tok.substr(0, 2);
      o = find_short(tok[1]);
      if (tok.size() > 2)
        inline_value = tok.substr(tok[2] == '=' ? 3 : 2);
    } else {
      errors.push_back("unexpected argument '" + tok + "' (options start with --; see --help)");
      continue;
    }
    if (o == nullptr) {
      errors.push_back("unknown option '" + spelled + "' (see --help)");
      // Its values, if any, belong to it: skip them rather than report
      // each as an unexpected argument.
      while (i < argc && !looks_like_option(argv[i] == nullptr ? "" : argv[i]))
        ++i;
      continue;
    }
    if (o->key == "help") {
      cl.help = true;
      return cl;
    }
    if (o->key == "version") {
      cl.version = true;
      return cl;
    }
    if (o->key == "check-config") {
      cl.check_only = true;
      continue;
    }

    RawValue v{spelled, {}, {}};
    if (inline_value)
      v.values.push_back(*inline_value);
    // argparse's nargs="+": a list option takes every following token up
    // to the next option; a single-valued one takes exactly one.
    while (i < argc && (v.values.empty() || o->list)) {
      const std::string_view next = argv[i] == nullptr ? "" : argv[i];
      if (looks_like_option(next))
        break;
      v.values.emplace_back(next);
      ++i;
    }
    if (v.values.empty()) {
      errors.push_back("missing value for " + spelled + " (expected " + std::string(o->metavar) +
                       (o->list ? " ..." : "") + ")");
      continue;
    }
    if (o->key == "config") {
      config_path = v.values.front();
      config_given = true;
      continue;
    }
    // Repeating an option replaces its earlier values, as with argparse,
    // but for the repeatable ones (--set-header A --set-header B).
    auto& slot = flags[std::string(o->key)];
    if (o->repeatable && !slot.values.empty()) {
      for (auto& value : v.values)
        slot.values.push_back(std::move(value));
    } else {
      slot = std::move(v);
    }
  }

  RawMap merged;
  if (config_given) {
    auto text = read_file(config_path);
    if (!text)
      errors.push_back(text.error());
    else
      merged = yaml_to_raw(*text, "config file '" + config_path + "'", errors);
  }
  for (auto& [key, value] : flags)
    merged[key] = std::move(value);

  auto config = apply_raw(Config{}, merged, errors);
  config.config_file = config_path;
  // Cross-field rules are checked even after a bad value, so one run
  // lists everything to fix; a rule broken only because a bad value was
  // left at its default is still worth knowing about.
  auto valid = validate(std::move(config));
  if (!valid) {
    std::string_view rest = valid.error();
    while (!rest.empty()) {
      const auto nl = std::min(rest.find('\n'), rest.size());
      errors.emplace_back(rest.substr(0, nl));
      rest.remove_prefix(std::min(nl + 1, rest.size()));
    }
  }
  if (!errors.empty())
    return fail_all(errors);
  cl.config = std::move(*valid);
  return cl;
}

Result<Config> validate(Config c) {
  Errors errors;
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
  if (c.upstream_cert.empty() != c.upstream_key.empty())
    errors.push_back("--upstream-cert and --upstream-key go together: give both or neither");
  if (c.workers > 1024) {
    errors.push_back("--workers: at most 1024 (got " + std::to_string(c.workers) + ")");
  }
  if (auto k = parse_kv_connector(c.kv_connector); !k)
    errors.push_back("--kv-connector: " + k.error());
  if (auto l = parse_log_level(c.log_level); !l)
    errors.push_back("--log-level: " + l.error());
  if (c.max_body_bytes == 0)
    errors.push_back("--max-body-size must be at least 1 byte");
  if (c.body_memory_limit < (1u << 20)) {
    errors.push_back("--body-memory-limit must be at least 1MiB (got " +
                     std::to_string(c.body_memory_limit) + " bytes)");
  }
  if (c.policy_memory < (1u << 20)) {
    errors.push_back("--policy-memory must be at least 1MiB (got " +
                     std::to_string(c.policy_memory) + " bytes)");
  }
  if (c.prefix_block_size < 16) {
    errors.push_back("--prefix-block-size must be at least 16 bytes (got " +
                     std::to_string(c.prefix_block_size) + ")");
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
    return fail_all(errors);
  return c;
}

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
  constexpr std::string_view groups[] = {kListener, kEngines, kLimits, kUpstream,
                                         kPolicies, kTracing, kGeneral};
  for (const auto group : groups) {
    out += "\n";
    out += group;
    out += ":\n";
    for (const auto& o : kOptions) {
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

namespace pdgate {
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

std::string mask_url_password(const std::string& url) {
  return url_without_secrets(url);
}

std::vector<ConfigEntry> effective_config(const Config& c) {
  std::vector<ConfigEntry> out;
  for (const auto& o : kOptions) {
    if (o.cli_only)
      continue;
    out.push_back({std::string(o.key), option_value(c, o.key), o.list, o.restart});
  }
  return out;
}

ConfigDiff diff_config(const Config& before, const Config& after) {
  ConfigDiff d;
  // What is applied is what reloadable_part() takes from `after` (with
  // prefill off, a prefill list stays as it was).
  const Config applied = reloadable_part(before, after);
  for (const auto& o : kOptions) {
    if (o.cli_only || spells_another_key(o.key))
      continue;
    const Config& now = o.restart ? after : applied;
    if (option_value(before, o.key) == option_value(now, o.key))
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
