#include "plugins/dns_discovery.hpp"

#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "core/upstream/health.hpp"
#include "plugins/dns_client.hpp"

namespace pdgate {

namespace net = boost::asio;

DnsDiscovery::DnsDiscovery(const Config& cfg, Registry& registry, const LoopGuard& loop_guard,
                           UpstreamValidator validator, std::string server_address,
                           std::uint16_t server_port)
    : cfg_(cfg),
      registry_(registry),
      loop_guard_(loop_guard),
      validator_(std::move(validator)),
      interval_(cfg.dns_interval),
      server_(std::move(server_address)),
      port_(server_port) {
  sources_.reserve(cfg.dns_sources.size());
  for (const auto& d : cfg.dns_sources) {
    sources_.emplace_back();
    sources_.back().spec = d;
  }
}

Result<std::unique_ptr<DnsDiscovery>> DnsDiscovery::create(const Config& cfg, Registry& registry,
                                                           const LoopGuard& loop_guard,
                                                           std::string server_address,
                                                           std::uint16_t server_port) {
  // No TLS: the instances a dns:// source makes are http:// ones.
  auto validator = UpstreamValidator::create(cfg, loop_guard);
  if (!validator)
    return fail(validator.error());
  return std::unique_ptr<DnsDiscovery>(new DnsDiscovery(
      cfg, registry, loop_guard, std::move(*validator), std::move(server_address), server_port));
}

Result<std::pair<std::string, std::uint16_t>> DnsDiscovery::server_from(const Config& cfg) {
  std::string text = cfg.dns_server;
  std::uint16_t port = 53;
  if (text.empty()) {
    std::ifstream in("/etc/resolv.conf");
    std::stringstream all;
    all << in.rdbuf();
    text = first_nameserver(all.str());
    if (text.empty())
      return fail("dns:// instance sources: no nameserver in /etc/resolv.conf; give --dns-server");
  } else if (auto u = parse_upstream(Role::decode, text)) {
    // HOST:PORT, parsed as an instance address is ([v6]:port included).
    text = u->host;
    port = u->port;
  } else {
    return fail("--dns-server: expected ADDRESS:PORT (" + u.error() + ")");
  }
  boost::system::error_code ec;
  net::ip::make_address(text, ec);
  if (ec)
    return fail("--dns-server: '" + text + "' is not an IP address");
  return std::pair{text, port};
}

void DnsDiscovery::start(net::any_io_executor ex) {
  net::co_spawn(ex, loop(ex), net::detached);
}

net::awaitable<void> DnsDiscovery::loop(net::any_io_executor ex) {
  net::steady_timer timer(ex);
  for (;;) {
    for (auto& s : sources_)
      co_await refresh(ex, s);
    timer.expires_after(interval_);
    auto [ec] = co_await timer.async_wait(net::as_tuple(net::use_awaitable));
    if (ec)
      co_return;
  }
}

net::awaitable<void> DnsDiscovery::refresh(net::any_io_executor ex, Source& s) {
  // A lookup may take at most half an interval (and 2 s), so a slow
  // server cannot stretch the period.
  const auto timeout = std::min<std::chrono::milliseconds>(interval_ / 2, std::chrono::seconds(2));
  std::set<std::string> urls;
  bool known = true;
  for (DnsType type : {DnsType::a, DnsType::aaaa}) {
    auto lookup = co_await dns_lookup(ex, server_, port_, s.spec.name, type, timeout);
    const auto& answer = lookup.answer;
    if (!answer) {
      ++s.failures[static_cast<int>(lookup.failure)];
      known = false;
      if (!s.warned) {
        spdlog::warn("{}: {}; keeping its {} instance(s)", s.spec.text(), answer.error(),
                     s.ids.size());
        s.warned = true;
      }
      break;
    }
    for (const auto& a : answer->addresses) {
      const bool v6 = a.find(':') != std::string::npos;
      urls.insert("http://" + (v6 ? "[" + a + "]" : a) + ":" + std::to_string(s.spec.port));
    }
  }
  if (!known)
    co_return;
  if (s.warned) {
    spdlog::info("{}: resolving again", s.spec.text());
    s.warned = false;
  }
  const std::int64_t now = steady_now_ms();
  s.resolved_at->store(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  s.addresses->store(urls.size());
  s.listed = urls;
  // Refusals are remembered only while the answers list the address.
  std::erase_if(s.refused, [&](const auto& r) { return !urls.count(r.first) || now >= r.second; });
  std::size_t over = 0;
  for (const auto& url : urls) {
    if (s.ids.count(url)) {
      s.absent_ms.erase(url);  // back before it was drained: nothing changes
      continue;
    }
    if (s.checking.count(url) || s.refused.count(url))
      continue;
    if (s.ids.size() + s.checking.size() >= cfg_.dns_max_instances) {
      ++over;
      continue;
    }
    s.checking.insert(url);
    net::co_spawn(ex, admit(s, url), net::detached);
  }
  if (over > 0) {
    s.refusals[limit] += over;
    spdlog::debug("{}: {} address(es) over --dns-max-instances {} ignored", s.spec.text(), over,
                  cfg_.dns_max_instances);
  }
  // Missing for kAbsentIntervals lookups in a row: drained, removed once
  // idle. Fewer, and it is kept as it is.
  const std::int64_t grace = kAbsentIntervals * interval_.count();
  for (auto it = s.ids.begin(); it != s.ids.end();) {
    if (urls.count(it->first)) {
      ++it;
      continue;
    }
    const std::int64_t since = s.absent_ms.try_emplace(it->first, now).first->second;
    if (now - since < grace) {
      ++it;
      continue;
    }
    registry_.drain(it->second, true, false);
    spdlog::info("{}: {} instance {} gone from DNS: draining, removed once idle", s.spec.text(),
                 to_string(s.spec.role), it->first);
    s.absent_ms.erase(it->first);
    it = s.ids.erase(it);
  }
  s.instances->store(s.ids.size());
}

void DnsDiscovery::refuse(Source& s, const std::string& url, Reason why,
                          const std::string& message) {
  ++s.refusals[why];
  // Outside the allow-list: not checked again while the answers list it
  // (the list does not change while pdgate runs). Anything else may pass
  // later (an engine still loading its model answers neither /v1/models
  // nor /health yet): checked again after a few intervals.
  s.refused[url] = why == allowed_upstreams
                       ? std::numeric_limits<std::int64_t>::max()
                       : steady_now_ms() + kRecheckIntervals * interval_.count();
  // One warning per source and reason every 10 s: a name that flaps
  // must not flood the log (the counter has them all).
  const std::int64_t now = steady_now_ms();
  if (now >= s.next_warning_ms[why]) {
    s.next_warning_ms[why] = now + 10'000;
    spdlog::warn("{}: {} not added: {} (pdgate_dns_refused_total counts every refusal)",
                 s.spec.text(), url, message);
  } else {
    spdlog::debug("{}: {} not added: {}", s.spec.text(), url, message);
  }
}

net::awaitable<void> DnsDiscovery::admit(Source& s, std::string url) {
  co_await check_and_add(s, url);
  // Not in a destructor: a frame destroyed unfinished (the control loop
  // gone at exit) must not touch the source.
  s.checking.erase(url);
}

net::awaitable<void> DnsDiscovery::check_and_add(Source& s, const std::string& url) {
  auto ex = co_await net::this_coro::executor;
  auto spec = parse_upstream(s.spec.role, url);
  if (!spec) {
    refuse(s, url, validation, spec.error());
    co_return;
  }
  // The checks of every other source of instances (admin API, Redis):
  // the allow-list first, so a refused address is never even probed.
  if (auto refused = co_await validator_.check(*spec)) {
    refuse(s, url, refused->kind == ErrorKind::forbidden ? allowed_upstreams : validation,
           refused->message);
    co_return;
  }
  // Healthy before it takes traffic, as an ejected instance must be to
  // come back.
  auto r = co_await probe_get(ex, spec->host, spec->port, "/health", cfg_.model_check_timeout,
                              loop_guard_.via_for_upstream({}));
  if (r.status < 200 || r.status >= 300) {
    refuse(s, url, unhealthy,
           "/health " + (r.status != 0 ? "answered " + std::to_string(r.status) : r.error));
    co_return;
  }
  // notify false: every replica resolves the same name itself, and asks
  // the cluster's id for what it found.
  std::vector<NewInstance> one;
  one.push_back({std::move(*spec), {}, 1});
  co_await registry_.take_cluster_ids(one);
  if (!s.listed.count(url))
    co_return;  // gone from the answers while it was checked
  auto out = std::move(registry_.add(std::move(one), false).front());
  if (out.error) {
    refuse(s, url, validation, out.error->message);  // the same URL given elsewhere
    co_return;
  }
  s.ids.emplace(url, out.instance->id);
  s.instances->store(s.ids.size());
  spdlog::info("{}: {} instance {} added (id {})", s.spec.text(), to_string(s.spec.role), url,
               out.instance->id);
}

void DnsDiscovery::write_metrics(PrometheusText& m) const {
  m.counter("pdgate_dns_refused_total",
            "Addresses found through dns:// sources and not added, by reason: "
            "allowed_upstreams, validation (loop, --model), unhealthy (GET /health), "
            "limit (--dns-max-instances).");
  static constexpr const char* kNames[kReasons] = {"allowed_upstreams", "validation", "unhealthy",
                                                   "limit"};
  for (const auto& s : sources_) {
    for (int r = 0; r < kReasons; ++r)
      m.sample("pdgate_dns_refused_total", {{"source", s.spec.text()}, {"reason", kNames[r]}},
               std::uint64_t{s.refusals[r].load(std::memory_order_relaxed)});
  }
  m.counter("pdgate_dns_lookup_failures_total",
            "Lookups of dns:// sources that got no answer, by kind: timeout, network (no "
            "server listening, socket errors), server_error (REFUSED, SERVFAIL...), malformed. "
            "A failed lookup changes no instance.");
  for (const auto& s : sources_) {
    for (int k = 0; k < kDnsFailureKinds; ++k)
      m.sample("pdgate_dns_lookup_failures_total",
               {{"source", s.spec.text()}, {"kind", to_string(static_cast<DnsFailure>(k))}},
               std::uint64_t{s.failures[k].load(std::memory_order_relaxed)});
  }
  m.gauge("pdgate_dns_last_resolution_timestamp_seconds",
          "When each dns:// source last got an answer (NXDOMAIN included), in Unix seconds; 0 "
          "before the first. time() minus it is how stale its instances may be.");
  for (const auto& s : sources_)
    m.sample("pdgate_dns_last_resolution_timestamp_seconds", {{"source", s.spec.text()}},
             s.resolved_at->load(std::memory_order_relaxed));
  m.gauge("pdgate_dns_addresses", "Addresses the last answer of each dns:// source listed.");
  for (const auto& s : sources_)
    m.sample("pdgate_dns_addresses", {{"source", s.spec.text()}},
             std::uint64_t{s.addresses->load(std::memory_order_relaxed)});
  m.gauge("pdgate_dns_instances",
          "Instances each dns:// source has in the registry (checked and healthy when added).");
  for (const auto& s : sources_)
    m.sample("pdgate_dns_instances", {{"source", s.spec.text()}},
             std::uint64_t{s.instances->load(std::memory_order_relaxed)});
}

}  // namespace pdgate
