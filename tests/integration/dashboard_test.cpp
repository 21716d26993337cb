// Prometheus (Debian's package) scrapes a running gateway, and every
// expression of examples/grafana-dashboard.json returns data: the
// dashboard shows what the gateway exports, under its current names.
// Skipped, with a message, when the prometheus binary is not installed.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

constexpr const char* kPrometheus = "/usr/bin/prometheus";

std::string url_encode(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (auto i = s.find(from); i != std::string::npos; i = s.find(from, i + to.size()))
    s.replace(i, from.size(), to);
}

// The dashboard's expressions with Grafana's variables as a user who picked
// "All" would have them.
std::vector<std::pair<std::string, std::string>> dashboard_expressions() {
  std::ifstream in(source_dir() + "/examples/grafana-dashboard.json");
  const Json d = Json::parse(in);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& p : d["panels"]) {
    for (const auto& t : p["targets"]) {
      std::string e = t["expr"];
      replace_all(e, "$__rate_interval", "15s");
      replace_all(e, "$job", ".*");
      replace_all(e, "$instance", ".*");
      out.emplace_back(p["title"].get<std::string>(), e);
    }
  }
  return out;
}

Json query(std::uint16_t port, const std::string& expr) {
  auto r = http_request(port, "GET", "/api/v1/query?query=" + url_encode(expr), {}, {},
                        std::chrono::seconds(10));
  if (r.status != 200)
    return Json{{"status", "error"}, {"http", r.status}, {"body", r.body}};
  return r.json();
}

// Every dashboard expression returns at least one series with a number
// (not NaN) from a Prometheus that scraped a gateway serving streams,
// whole answers and token usage; the template variables' metric exists
// under the scrape's job and instance labels.
TEST(Dashboard, EveryExpressionReturnsData) {
  if (::access(kPrometheus, X_OK) != 0)
    GTEST_SKIP() << kPrometheus << " is not installed (Debian package prometheus)";
  const auto started = Clock::now();
  Sim p("prefill", {"--prefill-base-ms", "1"});
  Sim d("decode", {"--itl-ms", "2"});
  // With an API key, so the per-key panels have a key to show.
  const auto keys = std::filesystem::path(::testing::TempDir()) /
                    ("dashboard-keys-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(keys) << "keys:\n  - name: dashboard\n    sha256: "
                      << "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n";
  // With Redis, so the Redis health panel has connections to show.
  const std::uint16_t redis_port = closed_port();
  Process redis("redis-server", {"/usr/bin/redis-server", "--port", std::to_string(redis_port),
                                 "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"});
  ASSERT_TRUE(eventually([&] {
    return std::system(
               ("redis-cli -p " + std::to_string(redis_port) + " ping >/dev/null 2>&1").c_str()) ==
           0;
  })) << redis.log();
  // And a dns:// source, so the DNS panels have one to show (no server
  // answers it: its lookups fail, counted by kind).
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport(),
              "dns://dashboard.pdgate.test:8200", "--dns-server",
              "127.0.0.1:" + std::to_string(closed_port()), "--dns-interval", "500ms", "--policy",
              "least_load", "--access-log", "off", "--api-keys", keys.string(), "--redis",
              "redis://127.0.0.1:" + std::to_string(redis_port)});

  const auto dir =
      std::filesystem::path(::testing::TempDir()) / ("prometheus-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "data");
  std::ofstream(dir / "prometheus.yml")
      << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
         "scrape_configs:\n"
         "  - job_name: pdgate\n"
         "    static_configs: [{targets: ['127.0.0.1:"
      << gw.port() << "']}]\n";
  const std::uint16_t prom_port = closed_port();
  Process prom("prometheus",
               {kPrometheus, "--config.file=" + (dir / "prometheus.yml").string(),
                "--storage.tsdb.path=" + (dir / "data").string(),
                "--web.listen-address=127.0.0.1:" + std::to_string(prom_port), "--log.level=warn"});
  ASSERT_TRUE(eventually(
      [&] {
        try {
          return http_request(prom_port, "GET", "/-/ready").status == 200;
        } catch (const std::exception&) {
          return false;  // not listening yet
        }
      },
      std::chrono::seconds(20)))
      << prom.log();

  // Traffic all along, so that every rate has something to count.
  std::atomic<bool> stop{false};
  std::thread traffic([&] {
    for (int i = 0; !stop.load(); ++i) {
      Json body = {{"model", "sim-model"},
                   {"messages", {{{"role", "user"}, {"content", "hello " + std::to_string(i)}}}},
                   {"max_tokens", 4},
                   {"stream", i % 2 == 0}};
      if (i % 2 == 0)
        body["stream_options"] = {{"include_usage", true}};
      post_json(gw.port(), "/v1/chat/completions", body, {{"Authorization", "Bearer test"}});
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  // Enough scrapes for a 15 s rate window to hold several samples.
  const bool scraped = eventually(
      [&] {
        const Json r = query(prom_port, "count_over_time(up{job=\"pdgate\"}[1m]) >= 6");
        return r.value("status", "") == "success" && !r["data"]["result"].empty();
      },
      std::chrono::seconds(30));
  stop = true;
  traffic.join();
  ASSERT_TRUE(scraped) << prom.log();

  const Json vars = query(prom_port, "pdgate_build_info{job=~\".*\",instance=~\".*\"}");
  ASSERT_EQ(vars["data"]["result"].size(), 1u) << vars.dump();
  EXPECT_EQ(vars["data"]["result"][0]["metric"]["job"], "pdgate");

  const auto exprs = dashboard_expressions();
  EXPECT_GE(exprs.size(), 27u);
  for (const auto& [title, e] : exprs) {
    const Json r = query(prom_port, e);
    ASSERT_EQ(r.value("status", ""), "success") << title << ": " << e << "\n" << r.dump();
    bool number = false;
    for (const auto& s : r["data"]["result"])
      number = number || s["value"][1] != "NaN";
    EXPECT_TRUE(number) << title << ": " << e << " returned no data\n" << r.dump();
  }
  prom.signal(SIGTERM);
  prom.wait(std::chrono::seconds(10));
  std::filesystem::remove_all(dir);
  std::filesystem::remove(keys);
  EXPECT_LT(Clock::now() - started, std::chrono::seconds(60));
}

}  // namespace
}  // namespace pdgate::test
