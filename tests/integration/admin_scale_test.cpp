// The admin API with thousands of instances, against a real pdgate
// process: adds stay fast.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <vector>

#include "tests/integration/admin_gateway.hpp"
#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

using std::chrono::milliseconds;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Adds `urls` as decode instances over one keep-alive admin connection and
// returns how long each add took, in seconds. Every add must answer 201.
std::vector<double> add_all(std::uint16_t admin_port, const std::vector<std::string>& urls) {
  std::vector<double> took;
  took.reserve(urls.size());
  Connection c(admin_port);
  for (const auto& url : urls) {
    const auto t0 = Clock::now();
    c.send_request("POST", "/admin/instances", Json{{"role", "decode"}, {"url", url}}.dump(),
                   {{"X-API-Key", kAdminKey}, {"Content-Type", "application/json"}});
    const auto r = c.read_response();
    took.push_back(seconds_since(t0));
    if (r.status != 201)
      throw std::runtime_error("add of " + url + " answered " + std::to_string(r.status) + ": " +
                               r.body);
  }
  return took;
}

double sum(const std::vector<double>& v, std::size_t from, std::size_t to) {
  double s = 0;
  for (std::size_t i = from; i < to; ++i)
    s += v[i];
  return s;
}

// The median of v[from, to): one slow add on a busy machine does not move it.
double median(const std::vector<double>& v, std::size_t from, std::size_t to) {
  std::vector<double> part(v.begin() + static_cast<std::ptrdiff_t>(from),
                           v.begin() + static_cast<std::ptrdiff_t>(to));
  std::nth_element(part.begin(), part.begin() + static_cast<std::ptrdiff_t>(part.size() / 2),
                   part.end());
  return part[part.size() / 2];
}

// Distinct URLs that all reach one port of this host: 127.0.b.c:port. The
// kernel routes all of 127.0.0.0/8 to the loopback interface, so a listener
// bound to every address of the port answers each of them.
std::vector<std::string> loopback_urls(std::size_t n, std::uint16_t port) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back("http://127.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1) +
                  ":" + std::to_string(port));
  }
  return out;
}

// Thousands of probe connections at once need more descriptors than the
// usual soft limit; pdgate inherits the raised limit.
void raise_fd_limit() {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);
}

std::vector<std::string> quiet_gateway_args(const Sim& p, const Sim& d) {
  return {"--prefill", p.hostport(), "--decode", d.hostport(), "--log-level", "warn"};
}

// 1,000 adds over one keep-alive admin connection (allow-list on, so each
// is resolved and checked) take under 5 s in all, and the median add of the
// last hundred takes at most twice as long as that of the first hundred
// (plus 50 us): an add does not slow down as instances accumulate (it took
// five times as long when each add scanned every instance).
TEST(AdminScale, ThousandAddsAreFastAndDoNotSlowDown) {
  Sim p("prefill"), d("decode");
  auto args = quiet_gateway_args(p, d);
  args.insert(args.end(), {"--allowed-upstreams", "127.0.0.0/8"});
  AdminGateway g(args);
  const auto t0 = Clock::now();
  const auto took = add_all(g.admin, loopback_urls(1000, closed_port()));
  const double total = seconds_since(t0);
  const double first = median(took, 0, 100), last = median(took, 900, 1000);
  std::cout << "[ measured ] 1,000 adds: " << total
            << " s; median add of the first 100: " << first * 1e6
            << " us, of the last 100: " << last * 1e6 << " us\n";
  EXPECT_LT(total, 5.0);
  EXPECT_LT(last, 2 * first + 50e-6);
  EXPECT_EQ(g.instances().size(), 1002u);
}

// 10,000 adds complete in under 60 s, the last thousand in under 5 s (they
// took 140 s and 32 s when each add scanned every instance), with health checks and
// metrics scrapes of all of them (closed ports) running meanwhile; the list
// of all of them is served and the gateway is still healthy.
TEST(AdminScale, TenThousandAddsComplete) {
  raise_fd_limit();
  Sim p("prefill"), d("decode");
  AdminGateway g(quiet_gateway_args(p, d));
  const auto t0 = Clock::now();
  const auto took = add_all(g.admin, loopback_urls(10000, closed_port()));
  const double total = seconds_since(t0);
  const double first = sum(took, 0, 1000), last = sum(took, 9000, 10000);
  std::cout << "[ measured ] 10,000 adds: " << total << " s; first 1,000: " << first
            << " s, last 1,000: " << last << " s\n";
  EXPECT_LT(total, 60.0);
  EXPECT_LT(last, 5.0);
  const auto t1 = Clock::now();
  const auto listed = g.call("GET", "/admin/instances");
  std::cout << "[ measured ] GET /admin/instances with 10,002: " << seconds_since(t1) * 1000
            << " ms, " << listed.body.size() << " bytes\n";
  EXPECT_EQ(listed.json()["instances"].size(), 10002u);
  EXPECT_TRUE(g.gw->process().running());
  EXPECT_EQ(http_request(g.admin, "GET", "/health").status, 200);
}

}  // namespace
}  // namespace pdgate::test
