// Instances found in DNS (dns://NAME:PORT): a real dnsmasq serves the
// records; the test rewrites them and pdgate follows within an interval.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <poll.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <thread>

#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

using namespace std::chrono_literals;

bool have_dnsmasq() {
  return access("/usr/sbin/dnsmasq", X_OK) == 0;
}

// dnsmasq on a free loopback port, answering from a hosts file only, as
// the authority for pdgate.test (a name it does not list is NXDOMAIN).
class Dnsmasq {
 public:
  using Records = std::vector<std::pair<std::string, std::string>>;  // address, name
  explicit Dnsmasq(const Records& initial = {}) {
    dir_ = std::filesystem::temp_directory_path() / ("pdgate-dns-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    set(initial);
    port_ = closed_port();
    proc_ = std::make_unique<Process>(
        "dnsmasq", std::vector<std::string>{
                       "/usr/sbin/dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts",
                       "--port=" + std::to_string(port_), "--listen-address=127.0.0.1",
                       "--bind-interfaces", "--addn-hosts=" + hosts(), "--local=/pdgate.test/",
                       "--local-ttl=0", "--user=root", "--pid-file=", "--log-facility=-"});
  }
  ~Dnsmasq() {
    proc_->signal(SIGKILL);
    proc_->wait();
    std::filesystem::remove_all(dir_);
  }
  std::uint16_t port() const { return port_; }
  // Replaces the records (name -> addresses) and has dnsmasq read them.
  void set(const Records& records) {
    {
      std::ofstream f(hosts() + ".new");
      for (const auto& [addr, name] : records)
        f << addr << " " << name << "\n";
    }
    std::filesystem::rename(hosts() + ".new", hosts());
    ::chmod(hosts().c_str(), 0644);
    if (proc_)
      proc_->signal(SIGHUP);
  }

 private:
  std::string hosts() const { return (dir_ / "hosts").string(); }
  // Any answer to a query for a name under pdgate.test.
  bool answers() const {
    const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    timeval tv{0, 200'000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port_);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const char q[] =
        "\x00\x01\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
        "\x05probe\x06pdgate\x04test\x00\x00\x01\x00\x01";
    char buf[512];
    const bool ok =
        ::sendto(fd, q, sizeof q - 1, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) > 0 &&
        ::recv(fd, buf, sizeof buf, 0) > 0;
    ::close(fd);
    return ok;
  }
  std::filesystem::path dir_;
  std::uint16_t port_ = 0;
  std::unique_ptr<Process> proc_;
};

// A DNS server (UDP, on a free loopback port) that answers every A query
// with `count` addresses never given before (127.x.y.z, one at a time in
// order) with TTL 0, and every other query with no address: the records of
// a name that flaps. Written here from RFC 1035, not with pdgate's code.
class FlappingDns {
 public:
  explicit FlappingDns(int count) : count_(count) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("FlappingDns: cannot bind");
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FlappingDns() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::uint16_t port() const { return port_; }
  int queries() const { return queries_.load(); }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0)
        continue;
      unsigned char q[512];
      sockaddr_in from{};
      socklen_t len = sizeof from;
      const ssize_t n = ::recvfrom(fd_, q, sizeof q, 0, reinterpret_cast<sockaddr*>(&from), &len);
      if (n < 17)
        continue;
      // The question: its name, then type and class (4 bytes).
      std::size_t end = 12;
      while (end < static_cast<std::size_t>(n) && q[end] != 0)
        end += q[end] + 1;
      end += 5;
      if (end > static_cast<std::size_t>(n))
        continue;
      const bool type_a = q[end - 4] == 0 && q[end - 3] == 1;
      const int answers = type_a ? count_ : 0;
      std::vector<unsigned char> r(q, q + end);
      r[2] = 0x85;  // a response, authoritative, recursion desired
      r[3] = 0x80;  // recursion available, no error
      r[6] = 0;
      r[7] = static_cast<unsigned char>(answers);
      r[8] = r[9] = r[10] = r[11] = 0;
      for (int i = 0; i < answers; ++i) {
        const std::uint32_t k = ++next_;
        const unsigned char rr[] = {0xC0,
                                    12,
                                    0,
                                    1,
                                    0,
                                    1,
                                    0,
                                    0,
                                    0,
                                    0,  // name, A, IN, TTL 0
                                    0,
                                    4,
                                    127,
                                    static_cast<unsigned char>(k >> 16),
                                    static_cast<unsigned char>(k >> 8),
                                    static_cast<unsigned char>(k)};
        r.insert(r.end(), rr, rr + sizeof rr);
      }
      ::sendto(fd_, r.data(), r.size(), 0, reinterpret_cast<sockaddr*>(&from), len);
      ++queries_;
    }
  }
  const int count_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::uint32_t next_ = 0x010000;  // from 127.1.0.1
  std::atomic<int> queries_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The decode instances' URLs the gateway routes to.
std::set<std::string> decodes(std::uint16_t port) {
  std::set<std::string> out;
  const Json status = get(port, "/status").json();
  for (const auto& i : status["instances"]["decode"])
    out.insert(i.value("url", ""));
  return out;
}

Response chat(std::uint16_t port) {
  return post_json(port, "/v1/chat/completions",
                   {{"model", "sim-model"},
                    {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                    {"max_tokens", 2}});
}

// A gateway fed by DNS starts with no instance (not ready, 503), takes the
// engines the name resolves to as they appear, and drains the ones that
// disappear, within an interval each time; requests follow.
TEST(DnsDiscovery, InstancesFollowTheRecords) {
  if (!have_dnsmasq())
    GTEST_SKIP() << "dnsmasq is not installed (apt-get install dnsmasq-base)";
  Dnsmasq dns;
  Sim a("both");
  Sim b("both", {"--host", "127.0.0.2", "--port", std::to_string(a.port())});
  const std::string port = std::to_string(a.port());
  Gateway gw({"--model", "sim-model", "--prefill-servers-urls", "disable", "--decode",
              "dns://engines.pdgate.test:" + port, "--dns-server",
              "127.0.0.1:" + std::to_string(dns.port()), "--dns-interval", "300ms"});
  // Nothing resolves yet: up, but not ready, and requests get 503.
  EXPECT_EQ(get(gw.port(), "/livez").status, 200);
  EXPECT_EQ(get(gw.port(), "/readyz").status, 503);
  EXPECT_EQ(chat(gw.port()).status, 503);

  const std::string url_a = "http://127.0.0.1:" + port, url_b = "http://127.0.0.2:" + port;
  dns.set({{"127.0.0.1", "engines.pdgate.test"}});
  ASSERT_TRUE(eventually([&] { return decodes(gw.port()) == std::set{url_a}; }, 2s))
      << gw.process().log();
  EXPECT_EQ(get(gw.port(), "/readyz").status, 200);
  EXPECT_EQ(chat(gw.port()).status, 200);

  // Both, then only b: a is drained and gets nothing more.
  dns.set({{"127.0.0.1", "engines.pdgate.test"}, {"127.0.0.2", "engines.pdgate.test"}});
  ASSERT_TRUE(eventually([&] { return decodes(gw.port()) == std::set{url_a, url_b}; }, 2s));
  dns.set({{"127.0.0.2", "engines.pdgate.test"}});
  ASSERT_TRUE(eventually([&] { return decodes(gw.port()) == std::set{url_b}; }, 2s));
  const std::size_t a_before = a.requests().size();
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(chat(gw.port()).status, 200);
  EXPECT_EQ(a.requests().size(), a_before);

  // The name gone (NXDOMAIN): every instance drains, not ready again.
  dns.set({});
  ASSERT_TRUE(eventually([&] { return decodes(gw.port()).empty(); }, 2s));
  EXPECT_EQ(get(gw.port(), "/readyz").status, 503);
}

// A DNS server that does not answer changes nothing: instances found
// before stay.
TEST(DnsDiscovery, UnansweredLookupsKeepInstances) {
  if (!have_dnsmasq())
    GTEST_SKIP() << "dnsmasq is not installed (apt-get install dnsmasq-base)";
  auto dns = std::make_unique<Dnsmasq>(Dnsmasq::Records{{"127.0.0.1", "engines.pdgate.test"}});
  Sim a("both");
  const std::string port = std::to_string(a.port());
  Gateway gw({"--model", "sim-model", "--prefill-servers-urls", "disable", "--decode",
              "dns://engines.pdgate.test:" + port, "--dns-server",
              "127.0.0.1:" + std::to_string(dns->port()), "--dns-interval", "200ms"});
  const std::string url_a = "http://127.0.0.1:" + port;
  ASSERT_TRUE(eventually([&] { return decodes(gw.port()) == std::set{url_a}; }, 2s))
      << gw.process().log();
  dns.reset();
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(decodes(gw.port()), std::set{url_a});
  EXPECT_EQ(chat(gw.port()).status, 200);
}

// How many times the gateway's log says `needle`.
std::size_t count_in_log(Gateway& gw, const std::string& needle) {
  const std::string log = gw.process().log();
  std::size_t n = 0;
  for (auto at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1))
    ++n;
  return n;
}

// An address missing from one answer and back in the next is not churned:
// the instance stays (not drained, not added again) and keeps serving.
TEST(DnsDiscovery, AddressBackWithinAFewLookupsIsNotChurned) {
  if (!have_dnsmasq())
    GTEST_SKIP() << "dnsmasq is not installed (apt-get install dnsmasq-base)";
  Dnsmasq dns(Dnsmasq::Records{{"127.0.0.1", "engines.pdgate.test"}});
  Sim a("both");
  const std::string port = std::to_string(a.port());
  Gateway gw({"--model", "sim-model", "--prefill-servers-urls", "disable", "--decode",
              "dns://engines.pdgate.test:" + port, "--dns-server",
              "127.0.0.1:" + std::to_string(dns.port()), "--dns-interval", "300ms"});
  const std::string url_a = "http://127.0.0.1:" + port;
  ASSERT_TRUE(eventually([&] { return decodes(gw.port()) == std::set{url_a}; }, 3s))
      << gw.process().log();
  dns.set({});
  std::this_thread::sleep_for(350ms);
  dns.set({{"127.0.0.1", "engines.pdgate.test"}});
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(decodes(gw.port()), std::set{url_a});
  EXPECT_EQ(count_in_log(gw, "instance " + url_a + " added"), 1u) << gw.process().log();
  EXPECT_EQ(count_in_log(gw, "gone from DNS"), 0u) << gw.process().log();
  EXPECT_EQ(chat(gw.port()).status, 200);
}

// An address that does not answer yet (an engine still loading) is not
// added, but checked again a few lookups later: once its engine is up, it
// becomes an instance.
TEST(DnsDiscovery, AddressRefusedWhileDownIsAddedOnceItAnswers) {
  if (!have_dnsmasq())
    GTEST_SKIP() << "dnsmasq is not installed (apt-get install dnsmasq-base)";
  Dnsmasq dns(Dnsmasq::Records{{"127.0.0.1", "engines.pdgate.test"}});
  const std::string port = std::to_string(closed_port());
  Gateway gw({"--model", "sim-model", "--prefill-servers-urls", "disable", "--decode",
              "dns://engines.pdgate.test:" + port, "--dns-server",
              "127.0.0.1:" + std::to_string(dns.port()), "--dns-interval", "200ms"});
  std::this_thread::sleep_for(600ms);
  EXPECT_TRUE(decodes(gw.port()).empty());
  EXPECT_EQ(chat(gw.port()).status, 503);
  Sim late("both", {"--port", port});
  ASSERT_TRUE(eventually([&] { return decodes(gw.port()) == std::set{late.url()}; }, 3s))
      << gw.process().log();
  EXPECT_EQ(chat(gw.port()).status, 200);
}

// --allowed-upstreams holds for addresses found in DNS as for every other
// source: of a name resolving to 127.0.0.1 and 127.0.0.2 under
// --allowed-upstreams 127.0.0.2/32, only the second becomes an instance;
// the first is refused, counted, and never gets a request.
TEST(DnsDiscovery, AllowedUpstreamsHoldsForDnsAnswers) {
  if (!have_dnsmasq())
    GTEST_SKIP() << "dnsmasq is not installed (apt-get install dnsmasq-base)";
  Dnsmasq dns(
      Dnsmasq::Records{{"127.0.0.1", "engines.pdgate.test"}, {"127.0.0.2", "engines.pdgate.test"}});
  Sim a("both");
  Sim b("both", {"--host", "127.0.0.2", "--port", std::to_string(a.port())});
  const std::string port = std::to_string(a.port());
  Gateway gw({"--model", "sim-model", "--prefill-servers-urls", "disable", "--decode",
              "dns://engines.pdgate.test:" + port, "--dns-server",
              "127.0.0.1:" + std::to_string(dns.port()), "--dns-interval", "200ms",
              "--allowed-upstreams", "127.0.0.2/32"});
  const std::string url_b = "http://127.0.0.2:" + port;
  ASSERT_TRUE(eventually([&] { return decodes(gw.port()) == std::set{url_b}; }, 3s))
      << gw.process().log();
  std::this_thread::sleep_for(600ms);  // a few more lookups
  EXPECT_EQ(decodes(gw.port()), std::set{url_b});
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(chat(gw.port()).status, 200);
  // (b's own count cannot be asked: the harness reaches a sim at 127.0.0.1)
  EXPECT_EQ(a.requests().size(), 0u);
  const std::string metrics = get(gw.port(), "/metrics").body;
  EXPECT_NE(metrics.find("pdgate_dns_refused_total{source=\"dns://engines.pdgate.test:" + port +
                         "\",reason=\"allowed_upstreams\"}"),
            std::string::npos)
      << metrics;
  EXPECT_NE(gw.process().log().find("outside --allowed-upstreams"), std::string::npos);
}

// The sample `series` (name and labels, as printed) of the gateway's
// /metrics, or -1 when absent.
double sample(std::uint16_t port, const std::string& series) {
  const std::string body = get(port, "/metrics").body;
  const auto at = body.find("\n" + series + " ");
  return at == std::string::npos ? -1 : std::stod(body.substr(at + series.size() + 2));
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Each dns:// source's state is on /metrics (issue 29, item 10): the
// instances it found and the addresses its last answer listed, when it last
// resolved, and its failed lookups by kind: a server refusing the name
// (server_error), no server at all (network or timeout). A failed lookup
// leaves the instances, and the last resolution's time, as they were.
TEST(DnsDiscovery, StateOfEachSourceIsOnMetrics) {
  if (!have_dnsmasq())
    GTEST_SKIP() << "dnsmasq is not installed (apt-get install dnsmasq-base)";
  auto dns = std::make_unique<Dnsmasq>(Dnsmasq::Records{{"127.0.0.1", "engines.pdgate.test"}});
  Sim a("both");
  const std::string port = std::to_string(a.port());
  // dnsmasq is the authority for pdgate.test only: it refuses other names.
  const std::string good = "dns://engines.pdgate.test:" + port,
                    refused = "dns://engines.example.com:" + port;
  const double started = unix_now();
  Gateway gw({"--model", "sim-model", "--prefill-servers-urls", "disable", "--decode", good,
              refused, "--dns-server", "127.0.0.1:" + std::to_string(dns->port()), "--dns-interval",
              "200ms"});
  auto of = [](const std::string& name, const std::string& source, const std::string& kind = "") {
    return name + "{source=\"" + source + "\"" + (kind.empty() ? "" : ",kind=\"" + kind + "\"") +
           "}";
  };
  ASSERT_TRUE(
      eventually([&] { return sample(gw.port(), of("pdgate_dns_instances", good)) == 1; }, 3s))
      << get(gw.port(), "/metrics").body;
  EXPECT_EQ(sample(gw.port(), of("pdgate_dns_addresses", good)), 1);
  const double last = sample(gw.port(), of("pdgate_dns_last_resolution_timestamp_seconds", good));
  EXPECT_GE(last, std::floor(started));
  EXPECT_LE(last, unix_now() + 1);
  EXPECT_EQ(sample(gw.port(), of("pdgate_dns_lookup_failures_total", good, "server_error")), 0);
  EXPECT_GE(sample(gw.port(), of("pdgate_dns_lookup_failures_total", refused, "server_error")), 1);
  EXPECT_EQ(sample(gw.port(), of("pdgate_dns_instances", refused)), 0);
  EXPECT_EQ(sample(gw.port(), of("pdgate_dns_last_resolution_timestamp_seconds", refused)), 0);

  // The server gone: its lookups fail (refused by the host, or
  // unanswered), the instance stays, the last resolution's time stops.
  dns.reset();
  const double gone = unix_now();
  auto unreachable = [&] {
    return sample(gw.port(), of("pdgate_dns_lookup_failures_total", good, "network")) +
           sample(gw.port(), of("pdgate_dns_lookup_failures_total", good, "timeout"));
  };
  ASSERT_TRUE(eventually([&] { return unreachable() >= 2; }, 3s))
      << get(gw.port(), "/metrics").body;
  EXPECT_EQ(sample(gw.port(), of("pdgate_dns_instances", good)), 1);
  EXPECT_LE(sample(gw.port(), of("pdgate_dns_last_resolution_timestamp_seconds", good)),
            gone + 0.5);
  EXPECT_EQ(chat(gw.port()).status, 200);
}

// A name that flaps (TTL 0, a fresh set of 50 dead addresses at every
// lookup) never takes traffic from a healthy static decode: new addresses
// are health-checked before they are added, so requests keep succeeding
// and no dead address becomes an instance.
TEST(DnsDiscovery, FlappingNameNeverDisplacesAHealthyInstance) {
  FlappingDns dns(50);
  Sim healthy("both");
  const std::string dead_port = std::to_string(closed_port());
  Gateway gw({"--model", "sim-model", "--prefill-servers-urls", "disable", "--decode",
              healthy.hostport(), "dns://flap.pdgate.test:" + dead_port, "--dns-server",
              "127.0.0.1:" + std::to_string(dns.port()), "--dns-interval", "200ms"});
  ASSERT_TRUE(eventually([&] { return dns.queries() >= 4; }, 3s)) << gw.process().log();
  const auto until = std::chrono::steady_clock::now() + 2s;
  int requests = 0, ok = 0;
  std::size_t most = 0;
  while (std::chrono::steady_clock::now() < until) {
    const auto r = chat(gw.port());
    ++requests;
    ok += r.status == 200;
    most = std::max(most, decodes(gw.port()).size());
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(ok, requests) << gw.process().log();
  EXPECT_EQ(most, 1u);
  EXPECT_GE(dns.queries(), 10);
  EXPECT_EQ(decodes(gw.port()), std::set{healthy.url()});
}

}  // namespace
}  // namespace pdgate::test
