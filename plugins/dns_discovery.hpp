// Instances found in DNS: each `dns://NAME:PORT` source of the
// configuration (a Kubernetes headless Service, say) is resolved every
// --dns-interval (A and AAAA, plugins/dns_client.hpp); an address that
// appears is added to the registry as an instance of the source's role,
// one that disappears is drained and removed once idle (its requests in
// flight finish). A lookup that fails (timeout, server error) changes
// nothing: only an answer, NXDOMAIN included, says what the set is.
//
// Runs on the control thread; the registry is thread-safe. Instances
// found this way are this replica's own (not shared through Redis: every
// replica resolves the same name).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "core/base/result.hpp"
#include "core/config/config.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

class DnsDiscovery {
 public:
  // `server`: "host:port" of the DNS server to ask (an address).
  DnsDiscovery(const Config& cfg, Registry& registry, std::string server_address,
               std::uint16_t server_port);
  DnsDiscovery(const DnsDiscovery&) = delete;
  DnsDiscovery& operator=(const DnsDiscovery&) = delete;

  // Resolves every source at once, then every interval, on `ex`.
  void start(boost::asio::any_io_executor ex);

  // The DNS server from --dns-server, else /etc/resolv.conf's first one.
  static Result<std::pair<std::string, std::uint16_t>> server_from(const Config& cfg);

 private:
  struct Source {
    DnsSource spec;
    std::map<std::string, std::uint64_t> ids;  // instance URL -> registry id
    bool warned = false;
  };
  boost::asio::awaitable<void> loop(boost::asio::any_io_executor ex);
  boost::asio::awaitable<void> refresh(boost::asio::any_io_executor ex, Source& s);

  Registry& registry_;
  const std::chrono::milliseconds interval_;
  const std::string server_;
  const std::uint16_t port_;
  std::vector<Source> sources_;
};

}  // namespace pdgate
