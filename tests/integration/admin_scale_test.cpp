// The admin API and the engine probes (health checks, metrics scrapes) with
// thousands of instances, against a real pdgate process: adds stay fast,
// and probes run with bounded concurrency, spread over their interval.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iostream>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
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

// A stand-in for thousands of engines: one listener that either answers
// every request with 200 at once or accepts and never answers (an engine
// that hangs), and counts how many connections are open at the same time
// and when each was accepted.
class ProbeSink {
 public:
  // `bound`: the most connections pdgate should hold open at once; a count
  // above it is confirmed before it is believed (see settle_new_maximum).
  explicit ProbeSink(bool answer, std::size_t bound = SIZE_MAX) : answer_(answer), bound_(bound) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(listener_, 4096) != 0) {
      throw std::runtime_error("ProbeSink: cannot listen");
    }
    socklen_t len = sizeof a;
    getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listener_;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, listener_, &ev);
    thread_ = std::thread([this] { run(); });
  }
  ~ProbeSink() {
    stop_ = true;
    thread_.join();
    for (int fd : open_fds_)
      close(fd);
    close(epoll_);
    close(listener_);
  }
  std::uint16_t port() const { return port_; }
  std::size_t max_open() const { return max_open_.load(); }
  std::size_t open_now() const { return open_.load(); }
  std::size_t accepted() const { return accepted_.load(); }
  // Accept times (steady clock) from `since` on.
  std::vector<Clock::time_point> accepts_since(Clock::time_point since) {
    std::lock_guard lock(mu_);
    std::vector<Clock::time_point> out;
    for (auto t : accept_times_) {
      if (t >= since)
        out.push_back(t);
    }
    return out;
  }
  void reset_max() { max_open_ = open_.load(); }

 private:
  // Forgets a connection the peer closed.
  void drop(int fd) {
    epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    open_fds_.erase(std::find(open_fds_.begin(), open_fds_.end(), fd));
    --open_;
  }

  // A new maximum: first forget connections whose close this thread has
  // not seen yet, so the count is what pdgate holds. pdgate closes a
  // probe's connection before it opens the next, but on a loaded machine
  // the kernel may hand the sink the new connection before the old one's
  // FIN: loopback packets wait in per-CPU queues, and the close and the
  // connect can be queued on different CPUs. So a count above both the
  // last maximum and the bound is confirmed only after the queues have had
  // 20 ms to drain (once seen as 33 against a bound of 32 in a loaded
  // suite run). Counts at or under the bound never wait, so the accept
  // times stay true.
  void settle_new_maximum() {
    for (int attempt = 0;; ++attempt) {
      const auto open_fds = open_fds_;
      for (int fd : open_fds) {
        if (peer_closed(fd))
          drop(fd);
      }
      if (open_.load() <= std::max(max_open_.load(), bound_) || attempt == 4)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    max_open_ = std::max(max_open_.load(), open_.load());
  }

  // Whether the peer of `fd` has closed it (its FIN is queued).
  static bool peer_closed(int fd) {
    char b;
    const auto got = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }

  void run() {
    std::vector<epoll_event> events(512);
    while (!stop_) {
      const int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), 20);
      bool accept_ready = false;
      // Closures before accepts: pdgate closes one probe's connection
      // before it opens the next, and both may be in one batch.
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == listener_) {
          accept_ready = true;
          continue;
        }
        char buf[4096];
        const auto got = recv(fd, buf, sizeof buf, 0);
        const bool closed = got == 0 || (got < 0 && errno != EAGAIN) ||
                            (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0;
        // An admin add's GET /v1/models is always answered: the engines
        // hang only once they are in.
        const bool answer =
            got > 0 &&
            (answer_ ||
             std::string_view(buf, static_cast<std::size_t>(got)).starts_with("GET /v1/models"));
        if (answer) {
          static constexpr char kOk[] =
              "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
              "Connection: close\r\n\r\n{}";
          (void)!send(fd, kOk, sizeof kOk - 1, MSG_NOSIGNAL);
        }
        if (closed || answer)
          drop(fd);
      }
      if (!accept_ready)
        continue;
      for (;;) {
        const int c = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0)
          break;
        ++accepted_;
        {
          std::lock_guard lock(mu_);
          accept_times_.push_back(Clock::now());
        }
        // Closed while it waited in the backlog (this thread was slow):
        // never open at the same time as the ones after it.
        if (peer_closed(c)) {
          close(c);
          continue;
        }
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.fd = c;
        epoll_ctl(epoll_, EPOLL_CTL_ADD, c, &ev);
        open_fds_.push_back(c);
        ++open_;
        if (open_.load() > max_open_.load())
          settle_new_maximum();
      }
    }
  }

  bool answer_;
  std::size_t bound_;
  int listener_ = -1;
  int epoll_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::vector<int> open_fds_;  // the sink thread's only
  std::atomic<std::size_t> open_{0}, max_open_{0}, accepted_{0};
  std::mutex mu_;
  std::vector<Clock::time_point> accept_times_;
};

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
  // What this guards against is an add that scans every instance: at
  // 1,000 that costs milliseconds. A median of 100 adds measured ~120 us
  // either way on an idle machine, but under the suite's parallel load
  // one median moved by a few hundred us (2x + 50 us failed once there),
  // so the bound leaves room for that.
  EXPECT_LT(last, 3 * first + 300e-6);
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
  // The bounds are the issue's, for the normal build. With no request in
  // flight, nobody holds the instance set and an add changes it in place.
  // It used to publish a copy of every instance list per add, which made
  // the last thousand cost 0.55 s against 0.15 s for the first in the
  // normal build, and 9.6 s against 1.3 s under ASan+UBSan (15.9 s in a
  // loaded CI run, over the bounds below). Measured since: 0.25 s and 0.40
  // s (normal), 0.80 s and 0.78 s (ASan). The health checks and scrapes
  // of more instances still cost more as they accumulate; the sanitized
  // build's bounds are looser for those.
#ifdef PDGATE_SANITIZED
  constexpr double kSlower = 3.0;
#else
  constexpr double kSlower = 1.0;
#endif
  EXPECT_LT(total, 60.0 * kSlower);
  EXPECT_LT(last, 5.0 * kSlower);
  EXPECT_LT(last, kSlower * 3 * first + 1.0) << "adds slow down as instances accumulate";
  const auto t1 = Clock::now();
  const auto listed = g.call("GET", "/admin/instances");
  std::cout << "[ measured ] GET /admin/instances with 10,002: " << seconds_since(t1) * 1000
            << " ms, " << listed.body.size() << " bytes\n";
  EXPECT_EQ(listed.json()["instances"].size(), 10002u);
  EXPECT_TRUE(g.gw->process().running());
  EXPECT_EQ(http_request(g.admin, "GET", "/health").status, 200);
}

// 2,000 instances whose engines accept and never answer: the health checks
// never hold more than --health-max-concurrency (32) connections at once,
// where they used to open one per instance in the same instant.
TEST(AdminScale, HealthChecksHoldAtMostTheBound) {
  raise_fd_limit();
  Sim p("prefill"), d("decode");
  ProbeSink hung(false, 32);
  auto args = quiet_gateway_args(p, d);
  args.insert(args.end(), {"--health-interval", "1s", "--health-max-concurrency", "32",
                           "--metrics-interval", "off"});
  AdminGateway g(args);
  add_all(g.admin, loopback_urls(2000, hung.port()));
  hung.reset_max();  // the bound is on the probes, not on the adds' checks
  const auto after_adds = hung.accepted();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  std::cout << "[ measured ] health checks: " << hung.accepted() - after_adds
            << " connections in 3 s, at most " << hung.max_open() << " open at once\n";
  EXPECT_GT(hung.accepted() - after_adds, 32u);
  EXPECT_LE(hung.max_open(), 32u);
  EXPECT_TRUE(g.gw->process().running());
  EXPECT_EQ(http_request(g.admin, "GET", "/health").status, 200);
}

// The same for the engine-metrics scraper: 2,000 hung engines, at most 32
// scrapes open at once.
TEST(AdminScale, MetricsScrapesHoldAtMostTheBound) {
  raise_fd_limit();
  Sim p("prefill"), d("decode");
  ProbeSink hung(false, 32);
  auto args = quiet_gateway_args(p, d);
  args.insert(args.end(), {"--health-interval", "off", "--health-max-concurrency", "32",
                           "--metrics-interval", "1s"});
  AdminGateway g(args);
  add_all(g.admin, loopback_urls(2000, hung.port()));
  hung.reset_max();  // the bound is on the probes, not on the adds' checks
  const auto after_adds = hung.accepted();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  std::cout << "[ measured ] metrics scrapes: " << hung.accepted() - after_adds
            << " connections in 3 s, at most " << hung.max_open() << " open at once\n";
  EXPECT_GT(hung.accepted() - after_adds, 32u);
  EXPECT_LE(hung.max_open(), 32u);
  EXPECT_TRUE(g.gw->process().running());
}

// 200 engines answering at once, checked every second with room for all
// of them at the same time (--health-max-concurrency 1000): each second's
// checks are spread over the interval (no tenth of it holds more than 30%
// of them), not fired in one instant, and each instance is still checked
// about once a second.
TEST(AdminScale, HealthChecksAreSpreadOverTheInterval) {
  Sim p("prefill"), d("decode");
  ProbeSink sink(true);
  auto args = quiet_gateway_args(p, d);
  args.insert(args.end(), {"--health-interval", "1s", "--health-max-concurrency", "1000",
                           "--metrics-interval", "off"});
  AdminGateway g(args);
  add_all(g.admin, loopback_urls(200, sink.port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const auto since = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const auto accepts = sink.accepts_since(since);
  std::map<long, std::size_t> per_tenth;
  for (auto t : accepts)
    ++per_tenth[std::chrono::duration_cast<milliseconds>(t - since).count() / 100];
  std::size_t busiest = 0;
  for (const auto& [tenth, n] : per_tenth)
    busiest = std::max(busiest, n);
  std::cout << "[ measured ] " << accepts.size() << " checks in 3 s; busiest 100 ms held "
            << busiest << "\n";
  EXPECT_GE(accepts.size(), 500u);
  EXPECT_LE(accepts.size(), 700u);
  // Three rounds of 200: a round fired at once would put 200 in one tenth.
  EXPECT_LE(busiest, accepts.size() / 3 * 3 / 10);
  for (const auto& i : g.instances())
    EXPECT_EQ(i["state"], "active") << i.dump();
}

}  // namespace
}  // namespace pdgate::test
