#include "plugins/dns_discovery.hpp"

#include <fstream>
#include <set>
#include <sstream>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "plugins/dns_client.hpp"

namespace pdgate {

namespace net = boost::asio;

DnsDiscovery::DnsDiscovery(const Config& cfg, Registry& registry, std::string server_address,
                           std::uint16_t server_port)
    : registry_(registry),
      interval_(cfg.dns_interval),
      server_(std::move(server_address)),
      port_(server_port) {
  for (const auto& d : cfg.dns_sources)
    sources_.push_back(Source{d, {}, false});
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
    auto answer = co_await dns_lookup(ex, server_, port_, s.spec.name, type, timeout);
    if (!answer) {
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
  for (const auto& url : urls) {
    if (s.ids.count(url))
      continue;
    auto spec = parse_upstream(s.spec.role, url);
    if (!spec)
      continue;
    // notify false: every replica resolves the same name itself.
    auto out = registry_.add(std::move(*spec), {}, 1, false);
    if (out.error) {
      spdlog::warn("{}: {} not added: {}", s.spec.text(), url, out.error->message);
      continue;
    }
    s.ids.emplace(url, out.instance->id);
    spdlog::info("{}: {} instance {} added (id {})", s.spec.text(), to_string(s.spec.role), url,
                 out.instance->id);
  }
  for (auto it = s.ids.begin(); it != s.ids.end();) {
    if (urls.count(it->first)) {
      ++it;
      continue;
    }
    registry_.drain(it->second, true, false);
    spdlog::info("{}: {} instance {} gone from DNS: draining, removed once idle", s.spec.text(),
                 to_string(s.spec.role), it->first);
    it = s.ids.erase(it);
  }
}

}  // namespace pdgate
