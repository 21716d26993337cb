// Instances found in DNS: each `dns://NAME:PORT` source of the
// configuration (a Kubernetes headless Service, say) is resolved every
// --dns-interval (A and AAAA, plugins/dns_client.hpp). A lookup that fails
// (timeout, server error) changes nothing: only an answer, NXDOMAIN
// included, says what the set is.
//
// DNS is not trusted more than any other source. An address that appears
// is first checked like an instance added through the admin API
// (core/upstream/upstream_validator.hpp: --allowed-upstreams, routing
// loop, --model), then must answer GET /health with a 2xx; only then is it
// added to the registry as an instance of the source's role. So a name
// that flaps (TTL 0, a new set of dead addresses at every lookup) never
// puts an untested address in front of requests. Addresses refused are
// counted (pdgate_dns_refused_total) and not checked again while the
// answers keep them (outside the allow-list) or for kRecheckIntervals
// lookups (anything else: an engine still loading may pass later). One source
// contributes at most --dns-max-instances, addresses being checked
// included. An instance missing from the answers is drained (its requests
// in flight finish) and removed once idle, but only once it has been
// missing for kAbsentIntervals intervals: an address that leaves the
// answer and comes back does not churn.
//
// Runs on the control thread; the registry is thread-safe. Instances
// found this way are this replica's own (not shared through Redis: every
// replica resolves the same name).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "core/base/result.hpp"
#include "core/config/config.hpp"
#include "core/net/loop_guard.hpp"
#include "core/observability/prometheus.hpp"
#include "core/upstream/instance.hpp"
#include "core/upstream/upstream_validator.hpp"
#include "plugins/dns_client.hpp"

namespace pdgate {

class DnsDiscovery {
 public:
  // `server`: "host:port" of the DNS server to ask (an address). Fails
  // when --allowed-upstreams does not parse. `cfg` and `loop_guard` must
  // outlive it.
  static Result<std::unique_ptr<DnsDiscovery>> create(const Config& cfg, Registry& registry,
                                                      const LoopGuard& loop_guard,
                                                      std::string server_address,
                                                      std::uint16_t server_port);
  DnsDiscovery(const DnsDiscovery&) = delete;
  DnsDiscovery& operator=(const DnsDiscovery&) = delete;

  // Resolves every source at once, then every interval, on `ex` (one
  // thread: the sources' state is not locked).
  void start(boost::asio::any_io_executor ex);

  // Each source's state: pdgate_dns_refused_total{source, reason}
  // (addresses not added), pdgate_dns_instances and pdgate_dns_addresses
  // (instances it has, addresses its last answer listed),
  // pdgate_dns_last_resolution_timestamp_seconds, and
  // pdgate_dns_lookup_failures_total{source, kind}. Any thread.
  void write_metrics(PrometheusText& m) const;

  // The DNS server from --dns-server, else /etc/resolv.conf's first one.
  static Result<std::pair<std::string, std::uint16_t>> server_from(const Config& cfg);

  // Lookups an instance may be missing from before it is drained.
  static constexpr int kAbsentIntervals = 3;
  // Lookups an address refused for anything but the allow-list waits
  // before it is checked again.
  static constexpr int kRecheckIntervals = 3;

 private:
  // Why an address was not added, as counted.
  enum Reason { allowed_upstreams, validation, unhealthy, limit, kReasons };
  struct Source {
    DnsSource spec;
    std::map<std::string, std::uint64_t> ids;       // instance URL -> registry id
    std::map<std::string, std::int64_t> absent_ms;  // instance URL -> missing since (steady)
    std::set<std::string> checking;                 // being validated and health-checked
    // Refused: not checked again before this (steady ms; max: while listed).
    std::map<std::string, std::int64_t> refused;
    std::set<std::string> listed;  // the addresses of the last answer
    bool warned = false;
    std::int64_t next_warning_ms[kReasons] = {};  // steady clock, per reason
    std::unique_ptr<std::atomic<std::uint64_t>[]> refusals =
        std::make_unique<std::atomic<std::uint64_t>[]>(kReasons);
    // For /metrics, read on any thread (the maps above are the control
    // thread's): lookups failed by DnsFailure, instances and addresses
    // now, the wall-clock time of the last answer (0: none yet).
    std::unique_ptr<std::atomic<std::uint64_t>[]> failures =
        std::make_unique<std::atomic<std::uint64_t>[]>(kDnsFailureKinds);
    std::unique_ptr<std::atomic<std::uint64_t>> instances =
        std::make_unique<std::atomic<std::uint64_t>>(0);
    std::unique_ptr<std::atomic<std::uint64_t>> addresses =
        std::make_unique<std::atomic<std::uint64_t>>(0);
    std::unique_ptr<std::atomic<double>> resolved_at = std::make_unique<std::atomic<double>>(0.0);
  };
  DnsDiscovery(const Config& cfg, Registry& registry, const LoopGuard& loop_guard,
               UpstreamValidator validator, std::string server_address, std::uint16_t server_port);
  boost::asio::awaitable<void> loop(boost::asio::any_io_executor ex);
  boost::asio::awaitable<void> refresh(boost::asio::any_io_executor ex, Source& s);
  // Validates and health-checks one new address; adds it if it passes and
  // the answers still list it.
  boost::asio::awaitable<void> admit(Source& s, std::string url);
  boost::asio::awaitable<void> check_and_add(Source& s, const std::string& url);
  void refuse(Source& s, const std::string& url, Reason why, const std::string& message);

  const Config& cfg_;
  Registry& registry_;
  const LoopGuard& loop_guard_;
  const UpstreamValidator validator_;
  const std::chrono::milliseconds interval_;
  const std::string server_;
  const std::uint16_t port_;
  std::vector<Source> sources_;
};

}  // namespace pdgate
