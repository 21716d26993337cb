// Redis over TLS (rediss://, rediss+sentinel://) and the Redis connection
// metrics, with real processes: redis-server and redis-sentinel serving
// only TLS ports with certificates made by tests/integration/pki.hpp, two
// pdgate replicas sharing conversations and the instance registry through
// them, and a plain redis-server killed and restarted under a gateway.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/integration/harness.hpp"
#include "tests/integration/pki.hpp"
#include "tests/plugins/redis_server.hpp"
#include "tests/robustness/util.hpp"

namespace pdgate::test {
namespace {

using namespace std::chrono_literals;

Pki* pki = nullptr;

class PkiEnv : public ::testing::Environment {
 public:
  void SetUp() override { pki = new Pki(); }
  void TearDown() override {
    delete pki;
    pki = nullptr;
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new PkiEnv);

// A Redis serving TLS only, with the engine certificate (localhost,
// 127.0.0.1, signed by the root); `clients` asks for client certificates.
RedisTls redis_tls(bool clients = false) {
  RedisTls t;
  t.cert = pki->path("engine.pem");
  t.key = pki->path("engine.key");
  t.ca = pki->path("ca.pem");
  t.require_client_cert = clients;
  t.client_cert = pki->path("client.pem");
  t.client_key = pki->path("client.key");
  return t;
}

Json store_health(std::uint16_t port) {
  return get(port, "/health").json()["conversation_store"];
}

// One conversation's two turns through `first` then `second`: the second
// reuses what the first stored in Redis (the prefill gets decode's params).
void expect_turn_shared(std::uint16_t first, std::uint16_t second, Sim& p, const std::string& id) {
  Json messages = Json::array({{{"role", "user"}, {"content", "Hello over TLS"}}});
  Json body = {
      {"model", "sim-model"}, {"messages", messages}, {"max_tokens", 4}, {"conversation_id", id}};
  const Headers h = {{"Authorization", "Bearer tls-client"}, {"X-Request-Id", id + "-1"}};
  auto r1 = post_json(first, "/v1/chat/completions", body, h);
  ASSERT_EQ(r1.status, 200) << r1.body;
  messages.push_back(
      {{"role", "assistant"}, {"content", r1.json()["choices"][0]["message"]["content"]}});
  messages.push_back({{"role", "user"}, {"content", "And again"}});
  body["messages"] = messages;
  const Headers h2 = {{"Authorization", "Bearer tls-client"}, {"X-Request-Id", id + "-2"}};
  auto r2 = post_json(second, "/v1/chat/completions", body, h2);
  ASSERT_EQ(r2.status, 200) << r2.body;
  bool reused = false;
  for (auto& rec : p.requests()) {
    if (rec.value("x_request_id", Json()) == id + "-2")
      reused = rec["kv_result"] == "valid";
  }
  EXPECT_TRUE(reused) << p.requests().dump();
}

std::vector<std::string> gateway_args(const Sim& p, const Sim& d, const std::string& redis_url,
                                      std::vector<std::string> extra) {
  std::vector<std::string> a = {
      "--model", "sim-model", "--prefill",    p.hostport(), "--decode",       d.hostport(),
      "--redis", redis_url,   "--admin-port", "0",          "--redis-tls-ca", pki->path("ca.pem")};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Two replicas on a Redis that serves only TLS and asks for client
// certificates: a conversation's turn stored through one is reused
// through the other, an instance added on one replica's admin API is
// served by the other, and /metrics shows every part connected.
TEST(RedisTls, SharedStateOverMutualTls) {
  ASSERT_TRUE(pki->ok());
  RedisServer redis({}, redis_tls(true));
  Sim p("prefill");
  Sim d("decode", {"--issue-decode-kv", "--itl-ms", "1"});
  Sim added("decode", {"--issue-decode-kv", "--itl-ms", "1"});
  const std::vector<std::string> client = {"--redis-tls-cert", pki->path("client.pem"),
                                           "--redis-tls-key", pki->path("client.key")};
  Gateway gw1(gateway_args(p, d, redis.url(), client), {{"ADMIN_API_KEY", "tls-admin"}});
  const auto admin1 = gw1.process().wait_listening();
  Gateway gw2(gateway_args(p, d, redis.url(), client));
  ASSERT_TRUE(eventually([&] { return store_health(gw1.port())["reachable"] == true; }, 10s))
      << gw1.process().log();
  ASSERT_TRUE(eventually([&] { return store_health(gw2.port())["reachable"] == true; }, 10s))
      << gw2.process().log();
  expect_turn_shared(gw1.port(), gw2.port(), p, "conv-tls");
  EXPECT_NE(redis.cli("dbsize"), "0");

  auto r = post_json(admin1, "/admin/instances",
                     {{"role", "decode"}, {"url", "http://" + added.hostport()}},
                     {{"Authorization", "Bearer tls-admin"}});
  ASSERT_EQ(r.status, 201) << r.body;
  EXPECT_TRUE(eventually(
      [&] { return get(gw2.port(), "/status").body.find(added.hostport()) != std::string::npos; },
      10s))
      << get(gw2.port(), "/status").body;

  for (const char* role : {"conversations", "registry", "load_sync", "kv_index"}) {
    EXPECT_GE(metric(gw2.port(), std::string("pdgate_redis_connected{role=\"") + role + "\"}"), 1)
        << role;
    EXPECT_EQ(metric(gw2.port(),
                     std::string("pdgate_redis_errors_total{role=\"") + role + "\",kind=\"tls\"}"),
              0)
        << role;
  }
}

// A gateway trusting another CA refuses the server's certificate: nothing
// is stored, the log says why in one line, the TLS failures are counted,
// and requests still succeed (turns proceed as cache misses). A gateway
// without a client certificate is refused by a server that asks for one.
TEST(RedisTls, WrongCaOrNoClientCertificateIsRefused) {
  ASSERT_TRUE(pki->ok());
  RedisServer redis({}, redis_tls(true));
  Sim d("both");
  Gateway gw({"--decode", d.hostport(), "--prefill-servers-urls", "disable", "--redis", redis.url(),
              "--redis-tls-ca", pki->path("other-ca.pem"), "--redis-tls-cert",
              pki->path("client.pem"), "--redis-tls-key", pki->path("client.key")});
  EXPECT_TRUE(eventually(
      [&] {
        return metric(gw.port(),
                      "pdgate_redis_errors_total{role=\"conversations\",kind=\"tls\"}") >= 1;
      },
      10s))
      << gw.process().log();
  const std::string log = gw.process().log();
  // OpenSSL's reason depends on the chain the server sends ("self-signed
  // certificate in certificate chain" when it includes the root).
  EXPECT_NE(log.find("unavailable (TLS handshake with localhost:" + std::to_string(redis.port()) +
                     ": certificate refused: "),
            std::string::npos)
      << log;
  EXPECT_EQ(store_health(gw.port())["reachable"], false);
  EXPECT_EQ(metric(gw.port(), "pdgate_redis_connected{role=\"conversations\"}"), 0);
  EXPECT_EQ(post_json(gw.port(), "/v1/completions",
                      {{"model", "sim-model"}, {"prompt", "x"}, {"max_tokens", 2}})
                .status,
            200);
  EXPECT_EQ(redis.cli("dbsize"), "0");

  // The right CA but no client certificate: the server ends the handshake.
  Gateway anonymous({"--decode", d.hostport(), "--prefill-servers-urls", "disable", "--redis",
                     redis.url(), "--redis-tls-ca", pki->path("ca.pem")});
  EXPECT_TRUE(eventually(
      [&] {
        const auto errors = [&](const char* kind) {
          return metric(anonymous.port(),
                        std::string("pdgate_redis_errors_total{role=\"conversations\",kind=\"") +
                            kind + "\"}");
        };
        return errors("tls") + errors("closed") >= 1;
      },
      10s))
      << anonymous.process().log();
  EXPECT_EQ(store_health(anonymous.port())["reachable"], false);
}

// rediss+sentinel://: the sentinel is asked over TLS where the master is,
// and the master (TLS only too) is reached at the address it names.
TEST(RedisTls, SentinelOverTls) {
  ASSERT_TRUE(pki->ok());
  if (!have_redis_sentinel())
    GTEST_SKIP() << "redis-sentinel is not installed (apt-get install redis-sentinel)";
  RedisServer master({}, redis_tls());
  RedisSentinel sentinel(master.port(), "mymaster", redis_tls());
  ASSERT_TRUE(eventually([&] { return sentinel.master_port() == master.port(); }, 10s));
  const std::string url =
      "rediss+sentinel://localhost:" + std::to_string(sentinel.port()) + "/mymaster";
  Sim p("prefill");
  Sim d("decode", {"--issue-decode-kv", "--itl-ms", "1"});
  Gateway gw(gateway_args(p, d, url, {}));
  ASSERT_TRUE(eventually([&] { return store_health(gw.port())["reachable"] == true; }, 10s))
      << gw.process().log();
  expect_turn_shared(gw.port(), gw.port(), p, "conv-sentinel-tls");
  EXPECT_NE(master.cli("dbsize"), "0");
}

// The connection state on /metrics through an outage of a plain Redis:
// connected, then 0 with the loss counted while it is down, then
// connected again with the reconnect counted.
TEST(RedisMetrics, OutageIsCounted) {
  RedisServer redis;
  Sim d("both");
  Gateway gw(
      {"--decode", d.hostport(), "--prefill-servers-urls", "disable", "--redis", redis.url()});
  const std::string connected = "pdgate_redis_connected{role=\"conversations\"}";
  const std::string registry = "pdgate_redis_connected{role=\"registry\"}";
  ASSERT_TRUE(eventually([&] { return metric(gw.port(), connected) >= 1; }, 10s))
      << gw.process().log();
  EXPECT_TRUE(eventually([&] { return metric(gw.port(), registry) >= 1; }, 10s));
  EXPECT_EQ(metric(gw.port(), "pdgate_redis_reconnects_total{role=\"registry\"}"), 0);
  redis.kill();
  EXPECT_TRUE(eventually([&] { return metric(gw.port(), registry) == 0; }, 10s));
  EXPECT_GE(metric(gw.port(), "pdgate_redis_errors_total{role=\"registry\",kind=\"closed\"}") +
                metric(gw.port(), "pdgate_redis_errors_total{role=\"registry\",kind=\"connect\"}"),
            1);
  redis.restart();
  EXPECT_TRUE(eventually([&] { return metric(gw.port(), registry) >= 1; }, 15s))
      << gw.process().log();
  EXPECT_GE(metric(gw.port(), "pdgate_redis_reconnects_total{role=\"registry\"}"), 1);
}

}  // namespace
}  // namespace pdgate::test
