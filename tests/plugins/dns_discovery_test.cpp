// Instances found in DNS (dns://NAME:PORT): a real dnsmasq serves the
// records; the test rewrites them and pdgate follows within an interval.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

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

}  // namespace
}  // namespace pdgate::test
