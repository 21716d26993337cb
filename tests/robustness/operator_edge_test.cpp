// What operators and load balancers see (issue 12): /health that tells
// the truth without fanning out (defect 11), debug routes and error bodies
// that do not open the cluster to clients (defect 14), and gateways that
// refuse to route to themselves (defect 8).
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "core/base/sha256.hpp"
#include "tests/integration/harness.hpp"
#include "tests/robustness/util.hpp"

namespace pdgate::test {
namespace {

using namespace std::chrono_literals;

const std::string kKey = "robustness-admin-key";

Json chat(bool stream = false) {
  return {{"model", "sim-model"},
          {"messages", {{{"role", "user"}, {"content", "hi"}}}},
          {"max_tokens", 3},
          {"stream", stream}};
}

// A gateway with its admin listener (key kKey).
struct Operated {
  explicit Operated(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    args.insert(args.end(), {"--admin-port", "0"});
    env.emplace("ADMIN_API_KEY", kKey);
    gw = std::make_unique<Gateway>(std::move(args), std::move(env));
    admin = gw->process().wait_listening();
  }
  std::uint16_t port() const { return gw->port(); }
  Response admin_call(const std::string& method, const std::string& target, const Json& body = {}) {
    Headers h = {{"X-API-Key", kKey}};
    if (!body.is_null())
      h.emplace_back("Content-Type", "application/json");
    return http_request(admin, method, target, body.is_null() ? "" : body.dump(), h);
  }
  std::unique_ptr<Gateway> gw;
  std::uint16_t admin = 0;
};

std::int64_t health_hits(Sim& s) {
  auto by_path = s.stats()["requests_total"];
  return by_path.contains("/health") ? by_path["/health"].get<std::int64_t>() : 0;
}

// The only decode removed: /health and /readyz answer 503 naming the
// empty role, so a load balancer stops sending traffic that would all get
// 503; /livez still answers 200 (the process is fine).
TEST(HealthEndpoints, RequiredRoleWithoutInstancesIs503) {
  Sim p("prefill"), d("decode");
  Operated gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  ASSERT_EQ(get(gw.port(), "/health").status, 200);
  ASSERT_EQ(get(gw.port(), "/readyz").status, 200);
  auto list = gw.admin_call("GET", "/admin/instances").json()["instances"];
  for (const auto& i : list) {
    if (i["role"] == "decode") {
      ASSERT_EQ(gw.admin_call("DELETE", "/admin/instances/" + i["id"].dump()).status, 202);
    }
  }
  auto h = get(gw.port(), "/health");
  EXPECT_EQ(h.status, 503) << h.body;
  EXPECT_EQ(h.json()["decode_cluster"], "empty");
  EXPECT_EQ(get(gw.port(), "/readyz").status, 503);
  EXPECT_EQ(get(gw.port(), "/livez").status, 200);
}

// /health answers from the health checker's state: 50 calls reach no
// engine (with checks off, the engines see no /health at all).
TEST(HealthEndpoints, HealthDoesNotFanOut) {
  Sim p("prefill"), d("decode");
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport(), "--health-interval", "off"});
  for (int i = 0; i < 50; ++i)
    ASSERT_EQ(get(gw.port(), "/health").status, 200);
  EXPECT_EQ(health_hits(p), 0);
  EXPECT_EQ(health_hits(d), 0);
}

// A decode that dies is ejected by the checks and /health, /readyz turn
// 503 with "unhealthy"; restarted on the same port, both recover.
TEST(HealthEndpoints, FollowTheChecks) {
  Sim p("prefill");
  auto d = std::make_unique<Sim>("decode");
  const auto port = d->port();
  Gateway gw({"--prefill", p.hostport(), "--decode", d->hostport(), "--health-interval", "100ms",
              "--health-fall", "1", "--health-rise", "1"});
  d.reset();
  EXPECT_TRUE(eventually([&] { return get(gw.port(), "/readyz").status == 503; }, 5s));
  auto h = get(gw.port(), "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.json()["decode_cluster"], "unhealthy");
  Sim again("decode", {"--port", std::to_string(port)});
  EXPECT_TRUE(eventually([&] { return get(gw.port(), "/readyz").status == 200; }, 10s));
}

// With an admin key set, the profiler routes on the client port need it
// (nothing reaches the engines without it); --profile-routes off turns
// them off.
TEST(DebugRoutes, ProfilingNeedsTheAdminKey) {
  Sim p("prefill"), d("decode");
  {
    Operated gw({"--prefill", p.hostport(), "--decode", d.hostport()});
    auto r = http_request(gw.port(), "POST", "/start_profile", "{}",
                          {{"Content-Type", "application/json"}});
    EXPECT_EQ(r.status, 401) << r.body;
    EXPECT_EQ(d.stats()["profile_total"]["start"], 0);
    r = http_request(gw.port(), "POST", "/start_profile", "{}",
                     {{"Content-Type", "application/json"}, {"X-API-Key", kKey}});
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(d.stats()["profile_total"]["start"], 1);
    // /status still answers, without the engines' addresses.
    auto st = get(gw.port(), "/status");
    EXPECT_EQ(st.status, 200);
    EXPECT_EQ(st.body.find(std::to_string(d.port())), std::string::npos) << st.body;
    EXPECT_EQ(st.json()["decode_node_count"], 1);
  }
  Gateway off({"--prefill", p.hostport(), "--decode", d.hostport(), "--profile-routes", "off"});
  EXPECT_EQ(http_request(off.port(), "POST", "/stop_profile", "{}",
                         {{"Content-Type", "application/json"}})
                .status,
            404);
  EXPECT_EQ(d.stats()["profile_total"]["stop"], 0);
}

// With --api-keys on and no admin key, the profiling routes (which reach
// every engine) need a client key as completions do: before, anyone got
// 200 and every engine started profiling (issue 32, item 8).
TEST(DebugRoutes, ProfilingNeedsAClientKeyWhenKeysAreOn) {
  Sim p("prefill"), d("decode");
  const auto keys = std::filesystem::temp_directory_path() /
                    ("pdgate-profile-keys-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(keys) << "keys:\n  - name: team\n    sha256: " << *sha256_hex("sk-team") << "\n";
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport(), "--api-keys", keys.string()});
  std::filesystem::remove(keys);
  const Headers json = {{"Content-Type", "application/json"}};
  for (const Headers& h : {json, Headers{{"Content-Type", "application/json"},
                                         {"Authorization", "Bearer sk-stranger"}}}) {
    const auto r = http_request(gw.port(), "POST", "/start_profile", "{}", h);
    EXPECT_EQ(r.status, 401) << r.body;
    EXPECT_EQ(r.json()["error"]["type"], "AuthenticationError") << r.body;
  }
  EXPECT_EQ(d.stats()["profile_total"]["start"], 0);
  const auto r =
      http_request(gw.port(), "POST", "/start_profile", "{}",
                   {{"Content-Type", "application/json"}, {"Authorization", "Bearer sk-team"}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(d.stats()["profile_total"]["start"], 1);
}

// With an admin key, /metrics on the client port hides the engines'
// addresses as /status does; the key's holder and the admin port see
// them (issue 32, item 9: before, anyone read every engine's URL there).
TEST(DebugRoutes, MetricsOnTheClientPortHideEngineAddresses) {
  Sim p("prefill"), d("decode");
  Operated gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  const std::string engine = "127.0.0.1:" + std::to_string(d.port());
  const auto anyone = get(gw.port(), "/metrics");
  ASSERT_EQ(anyone.status, 200);
  EXPECT_EQ(anyone.body.find(engine), std::string::npos);
  EXPECT_NE(anyone.body.find("pdgate_instance_in_flight{id="), std::string::npos) << anyone.body;
  const auto holder = http_request(gw.port(), "GET", "/metrics", "", {{"X-API-Key", kKey}});
  EXPECT_NE(holder.body.find(engine), std::string::npos);
  EXPECT_NE(gw.admin_call("GET", "/metrics").body.find(engine), std::string::npos);
}

// Errors a client sees name the stage, never an engine's address, unless
// --verbose-errors.
TEST(DebugRoutes, ErrorBodiesHideEngineAddresses) {
  Sim d("decode");
  const auto dead = std::to_string(closed_port());
  for (bool verbose : {false, true}) {
    std::vector<std::string> args = {"--prefill", "127.0.0.1:" + dead, "--decode", d.hostport()};
    if (verbose)
      args.insert(args.end(), {"--verbose-errors", "true"});
    Gateway gw(args);
    auto r = post_json(gw.port(), "/v1/chat/completions", chat());
    EXPECT_EQ(r.status, 502);
    EXPECT_NE(r.body.find("prefill"), std::string::npos) << r.body;
    EXPECT_EQ(r.body.find(dead) != std::string::npos, verbose) << r.body;
    auto s = post_json(gw.port(), "/v1/chat/completions", chat(true));
    EXPECT_EQ(s.body.find("127.0.0.1") != std::string::npos, verbose) << s.body;
  }
}

// A gateway's own client port added as a decode is refused, and so is
// another pdgate that forwards to this one (each would make requests and
// health checks loop).
TEST(Loops, AddingItselfOrALoopingGatewayIsRefused) {
  Sim p("prefill"), d("decode");
  Operated a({"--prefill", p.hostport(), "--decode", d.hostport()});
  auto r =
      a.admin_call("POST", "/admin/instances",
                   {{"role", "decode"}, {"url", "http://127.0.0.1:" + std::to_string(a.port())}});
  EXPECT_EQ(r.status, 422) << r.body;
  EXPECT_NE(r.body.find("loop"), std::string::npos) << r.body;
  Gateway b({"--prefill", p.hostport(), "--decode", "127.0.0.1:" + std::to_string(a.port())});
  r = a.admin_call("POST", "/admin/instances",
                   {{"role", "decode"}, {"url", "http://127.0.0.1:" + std::to_string(b.port())}});
  EXPECT_EQ(r.status, 422) << r.body;
  EXPECT_EQ(a.admin_call("GET", "/admin/instances").json()["instances"].size(), 2u);
}

// A gateway configured with itself as its decode answers requests with an
// error at once instead of calling itself recursively: descriptors stay
// few, and the looping instance is ejected by the checks.
TEST(Loops, SelfAsDecodeDoesNotRecurse) {
  Sim p("prefill");
  const auto self = std::to_string(closed_port());
  std::vector<std::string> argv = {build_dir() + "/pdgate",
                                   "--host",
                                   "127.0.0.1",
                                   "--port",
                                   self,
                                   "--workers",
                                   "2",
                                   "--prefill",
                                   p.hostport(),
                                   "--decode",
                                   "127.0.0.1:" + self,
                                   "--health-interval",
                                   "200ms"};
  Process gw("pdgate(self)", argv);
  const auto port = gw.wait_listening();
  const auto start = Clock::now();
  auto r = post_json(port, "/v1/chat/completions", chat());
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_GE(r.status, 500) << r.body;
  std::this_thread::sleep_for(1s);
  EXPECT_LT(fd_count(gw.pid()), 100);
  EXPECT_TRUE(eventually([&] { return get(port, "/readyz").status == 503; }, 5s));
}

}  // namespace
}  // namespace pdgate::test
