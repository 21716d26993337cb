// TLS on both sides, end to end: curl and openssl s_client talking to a
// pdgate that serves https (a chain in its certificate file, client
// certificates, a certificate reloaded on SIGHUP), and pdgate talking to
// pdgate-sim engines that serve https (E/P/D, SNI, CA checks, mTLS, pooled
// connections). Every certificate is made here with the openssl command:
// a root CA, an intermediate, server and client certificates, and a second
// CA no one trusts.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/admin_gateway.hpp"
#include "tests/integration/harness.hpp"
#include "tests/integration/pki.hpp"
#include "tests/robustness/util.hpp"

namespace pdgate::test {
namespace {

Pki* pki = nullptr;

class TlsEnv : public ::testing::Environment {
 public:
  void SetUp() override { pki = new Pki(); }
  void TearDown() override {
    delete pki;
    pki = nullptr;
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new TlsEnv);

struct CurlAnswer {
  int exit = -1;  // curl's: 0, or why the transfer failed (35: TLS handshake, 60: CA...)
  int status = 0;
  std::string body;
};

// One curl request to https://localhost:PORT; `extra` adds options.
CurlAnswer curl(std::uint16_t port, const std::string& target, const std::string& extra,
                const std::string& body = {}) {
  std::string cmd = "curl -sS --max-time 30 -o - -w '\\n%{http_code}' " + extra;
  if (!body.empty())
    cmd += " -H 'Content-Type: application/json' --data-binary '" + body + "'";
  cmd += " https://localhost:" + std::to_string(port) + target + " 2>/dev/null";
  auto r = run(cmd);
  CurlAnswer a;
  a.exit = r.exit;
  const auto nl = r.out.rfind('\n');
  if (nl != std::string::npos) {
    a.status = std::atoi(r.out.c_str() + nl + 1);
    a.body = r.out.substr(0, nl);
  }
  return a;
}

std::string cacert() {
  return "--cacert " + pki->path("ca.pem");
}

const std::string kCompletion =
    R"({"model":"sim-model","prompt":"hello tls","max_tokens":5,"stream":false})";
const std::string kStream =
    R"({"model":"sim-model","prompt":"hello tls","max_tokens":5,"stream":true})";

// A sim serving https with the engine certificate (or `cert`/`key`).
std::unique_ptr<Sim> tls_sim(const std::string& role, const std::string& cert = "engine",
                             std::vector<std::string> extra = {}) {
  extra.insert(extra.end(),
               {"--tls-cert", pki->path(cert + ".pem"), "--tls-key", pki->path(cert + ".key")});
  return std::make_unique<Sim>(role, extra);
}

std::string https_url(const Sim& s) {
  return "https://localhost:" + std::to_string(s.port());
}

// What a https sim recorded (GET /sim/requests over TLS), completions only.
Json sim_requests(const Sim& s) {
  // -k: the sim may serve a certificate the tests' CA did not sign.
  auto a = curl(s.port(), "/sim/requests", "-k");
  Json out = Json::array();
  for (auto& r : Json::parse(a.body, nullptr, false)) {
    if (r.value("path", "").find("/completions") != std::string::npos)
      out.push_back(r);
  }
  return out;
}

Json sim_stats(const Sim& s) {
  return Json::parse(curl(s.port(), "/sim/stats", "-k").body, nullptr, false);
}

// The serial number of the certificate a fresh handshake with PORT gets;
// `extra` adds s_client options (a client certificate).
std::string served_serial(std::uint16_t port, const std::string& extra = {}) {
  return run("timeout 20 openssl s_client -connect 127.0.0.1:" + std::to_string(port) +
             " -servername localhost " + extra +
             " </dev/null 2>/dev/null | openssl x509 -noout -serial "
             "2>/dev/null")
      .out;
}

std::vector<std::string> tls_listener() {
  return {"--tls-cert", pki->path("server-chain.pem"), "--tls-key", pki->path("server.key")};
}

// Clients over TLS: curl trusting only the root gets a whole answer and a
// whole stream (the intermediate comes from the gateway's chain file).
TEST(TlsClients, CurlGetsAnswersAndStreams) {
  ASSERT_TRUE(pki->ok());
  Sim p("prefill");
  Sim d("decode");
  auto args = tls_listener();
  args.insert(args.end(), {"--prefill", p.hostport(), "--decode", d.hostport()});
  Gateway gw(args);

  auto whole = curl(gw.port(), "/v1/completions", cacert(), kCompletion);
  ASSERT_EQ(whole.exit, 0);
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(Json::parse(whole.body)["usage"]["completion_tokens"], 5);

  auto stream = curl(gw.port(), "/v1/completions", "-N " + cacert(), kStream);
  ASSERT_EQ(stream.status, 200) << stream.body;
  const auto events = sse_data(stream.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (const auto& e : events) {
    if (e != "[DONE]")
      text += Json::parse(e)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_FALSE(text.empty());
  // Clients refusing older protocols still connect (TLS 1.3 offered).
  EXPECT_EQ(curl(gw.port(), "/health", "--tlsv1.3 " + cacert()).status, 200);
}

// --tls-min-version 1.3: a client limited to TLS 1.2 is refused, 1.3 works.
TEST(TlsClients, MinimumVersionIsEnforced) {
  ASSERT_TRUE(pki->ok());
  Sim d("both");
  auto args = tls_listener();
  args.insert(args.end(), {"--decode", d.hostport(), "--prefill-servers-urls", "disable",
                           "--tls-min-version", "1.3"});
  Gateway gw(args);
  EXPECT_NE(curl(gw.port(), "/health", "--tls-max 1.2 " + cacert()).exit, 0);
  EXPECT_EQ(curl(gw.port(), "/health", cacert()).status, 200);
}

// --tls-client-ca: no client certificate, no connection; the client's
// certificate signed by that CA gets its answer.
TEST(TlsClients, ClientCertificatesRequired) {
  ASSERT_TRUE(pki->ok());
  Sim d("both");
  auto args = tls_listener();
  args.insert(args.end(), {"--decode", d.hostport(), "--prefill-servers-urls", "disable",
                           "--tls-client-ca", pki->path("ca.pem")});
  Gateway gw(args);
  auto without = curl(gw.port(), "/v1/completions", cacert(), kCompletion);
  EXPECT_NE(without.exit, 0);
  EXPECT_EQ(without.status, 0);
  auto with =
      curl(gw.port(), "/v1/completions",
           cacert() + " --cert " + pki->path("client.pem") + " --key " + pki->path("client.key"),
           kCompletion);
  EXPECT_EQ(with.status, 200) << with.body;
  EXPECT_TRUE(d.requests().size() == 1u);
}

// With client certificates required on the client port, the kubelet's
// probes (HTTPS without a certificate, or plain HTTP) cannot pass there:
// the admin port answers /livez and /readyz in plain HTTP without the
// admin key, while its other routes keep asking for it.
TEST(TlsClients, ProbesPassOnTheAdminPortWithMutualTls) {
  ASSERT_TRUE(pki->ok());
  Sim d("both");
  auto args = tls_listener();
  args.insert(args.end(), {"--decode", d.hostport(), "--prefill-servers-urls", "disable",
                           "--tls-client-ca", pki->path("ca.pem"), "--admin-port", "0"});
  Gateway gw(args, {{"ADMIN_API_KEY", "probe-test-key"}});
  const auto admin = gw.process().wait_listening();
  // The client port refuses a probe without a certificate.
  EXPECT_NE(curl(gw.port(), "/livez", cacert()).status, 200);
  auto r = http_request(admin, "GET", "/livez");
  EXPECT_EQ(r.status, 200) << r.body;
  r = http_request(admin, "GET", "/readyz");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["status"], "ready") << r.body;
  EXPECT_EQ(http_request(admin, "GET", "/admin/instances").status, 401);
}

// The client port's certificate's expiry is a metric, so an alert can
// fire before clients see an expired certificate: the test's certificates
// are valid for 2 days.
TEST(TlsClients, CertificateExpiryIsAMetric) {
  ASSERT_TRUE(pki->ok());
  Sim d("both");
  auto args = tls_listener();
  args.insert(args.end(), {"--decode", d.hostport(), "--prefill-servers-urls", "disable"});
  Gateway gw(args);
  const auto page = curl(gw.port(), "/metrics", cacert());
  ASSERT_EQ(page.status, 200) << page.body;
  const std::string name = "\npdgate_tls_certificate_expiry_timestamp_seconds ";
  const auto at = page.body.find(name);
  ASSERT_NE(at, std::string::npos) << page.body;
  const double expiry = std::stod(page.body.substr(at + name.size()));
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_GT(expiry, now + 86400);
  EXPECT_LT(expiry, now + 3 * 86400);
}

// A plain-HTTP client on the TLS port, and one that connects and sends
// nothing, are closed (the latter within the header timeout) while a TLS
// client's stream on the same gateway completes; both count as failed
// handshakes.
TEST(TlsClients, PlainHttpAndSilentClientsAreClosed) {
  ASSERT_TRUE(pki->ok());
  Sim p("prefill");
  Sim d("decode", {"--itl-ms", "100"});
  auto args = tls_listener();
  args.insert(args.end(), {"--prefill", p.hostport(), "--decode", d.hostport(), "--header-timeout",
                           "1s", "--workers", "1"});
  Gateway gw(args);
  CurlAnswer streamed;
  std::thread tls_client([&] {
    streamed = curl(gw.port(), "/v1/completions", "-N " + cacert(),
                    R"({"model":"sim-model","prompt":"x","max_tokens":20,"stream":true})");
  });
  Connection silent(gw.port());
  Connection plain(gw.port());
  plain.send_request("GET", "/health", "");
  EXPECT_TRUE(plain.peer_closed(std::chrono::seconds(10)));
  const auto t0 = Clock::now();
  EXPECT_TRUE(silent.peer_closed(std::chrono::seconds(20)));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(15));
  tls_client.join();
  EXPECT_EQ(streamed.status, 200);
  EXPECT_EQ(sse_data(streamed.body).back(), "[DONE]");
  auto metrics = curl(gw.port(), "/metrics", cacert());
  EXPECT_NE(metrics.body.find("pdgate_tls_handshake_failures_total 2"), std::string::npos)
      << metrics.body;
}

// A TLS client that leaves mid-stream (curl's time limit) takes its engine
// request down with it: the decode engine sees the request aborted long
// before its 100 tokens were due.
TEST(TlsClients, ClientLeavingMidStreamAbortsTheEngine) {
  ASSERT_TRUE(pki->ok());
  Sim d("both", {"--itl-ms", "100"});
  auto args = tls_listener();
  args.insert(args.end(), {"--decode", d.hostport(), "--prefill-servers-urls", "disable"});
  Gateway gw(args);
  auto r = run("curl -sS -N --max-time 1 " + cacert() +
               " -H 'Content-Type: application/json' --data-binary "
               "'{\"model\":\"sim-model\",\"prompt\":\"x\",\"max_tokens\":100,\"stream\":true}' "
               "https://localhost:" +
               std::to_string(gw.port()) + "/v1/completions 2>/dev/null");
  EXPECT_EQ(r.exit, 28);  // curl's "operation timed out"
  EXPECT_NE(r.out.find("data: "), std::string::npos);
  EXPECT_TRUE(eventually([&] { return d.stats()["aborted_total"].get<int>() == 1; },
                         std::chrono::seconds(5)))
      << d.stats().dump();
}

// SIGHUP with new certificate files: new handshakes get the new
// certificate (its serial), a connection opened before keeps working; a
// key that does not match is refused and the served certificate stays.
TEST(TlsClients, CertificateReloadedOnSighup) {
  ASSERT_TRUE(pki->ok());
  Sim d("both");
  EditedFile cert("cert.pem", slurp(pki->path("server-chain.pem")));
  EditedFile key("key.pem", slurp(pki->path("server.key")));
  Gateway gw({"--tls-cert", cert.path(), "--tls-key", key.path(), "--decode", d.hostport(),
              "--prefill-servers-urls", "disable"});
  ASSERT_EQ(served_serial(gw.port()), "serial=1001\n");

  // A broken pair: the new certificate with the old key.
  cert.write(slurp(pki->path("server2-chain.pem")));
  gw.process().signal(SIGHUP);
  EXPECT_TRUE(
      eventually([&] { return gw.process().log().find("TLS: --tls-key") != std::string::npos; },
                 std::chrono::seconds(10)))
      << gw.process().log();
  EXPECT_EQ(served_serial(gw.port()), "serial=1001\n");
  EXPECT_EQ(curl(gw.port(), "/health", cacert()).status, 200);

  key.write(slurp(pki->path("server2.key")));
  gw.process().signal(SIGHUP);
  EXPECT_TRUE(eventually([&] { return served_serial(gw.port()) == "serial=1002\n"; },
                         std::chrono::seconds(10)));
  EXPECT_EQ(curl(gw.port(), "/v1/completions", cacert(), kCompletion).status, 200);
}

// The admin API over mutual TLS (--admin-tls-*): with the admin key and a
// client certificate the CA signed, /admin/instances answers; without a certificate, or in plain
// HTTP, no answer. SIGHUP with a new certificate and key: new admin handshakes get it, as the
// client listener's do; a key that does not match is refused and the served certificate stays.
TEST(TlsAdmin, AdminApiOverMutualTlsReloadedOnSighup) {
  ASSERT_TRUE(pki->ok());
  Sim d("both");
  EditedFile cert("admin-cert.pem", slurp(pki->path("server-chain.pem")));
  EditedFile key("admin-key.pem", slurp(pki->path("server.key")));
  Gateway gw({"--decode", d.hostport(), "--prefill-servers-urls", "disable", "--admin-port", "0",
              "--admin-tls-cert", cert.path(), "--admin-tls-key", key.path(),
              "--admin-tls-client-ca", pki->path("ca.pem")},
             {{"ADMIN_API_KEY", "admin-tls-key"}});
  const auto admin = gw.process().wait_listening();
  const std::string client_cert =
      " --cert " + pki->path("client.pem") + " --key " + pki->path("client.key");
  const std::string key_header = " -H 'Authorization: Bearer admin-tls-key'";
  auto with = curl(admin, "/admin/instances", cacert() + client_cert + key_header);
  ASSERT_EQ(with.exit, 0);
  EXPECT_EQ(with.status, 200) << with.body;
  EXPECT_NE(with.body.find(d.hostport()), std::string::npos) << with.body;
  // No client certificate: the handshake fails, nothing is answered.
  auto without = curl(admin, "/admin/instances", cacert() + key_header);
  EXPECT_NE(without.exit, 0);
  EXPECT_EQ(without.status, 0);
  // Plain HTTP on the TLS port: closed without an answer.
  Connection plain(admin);
  plain.send_request("GET", "/livez", "");
  EXPECT_TRUE(plain.peer_closed(std::chrono::seconds(10)));

  const std::string s_client_cert =
      "-cert " + pki->path("client.pem") + " -key " + pki->path("client.key");
  ASSERT_EQ(served_serial(admin, s_client_cert), "serial=1001\n");
  cert.write(slurp(pki->path("server2-chain.pem")));
  gw.process().signal(SIGHUP);
  EXPECT_TRUE(
      eventually([&] { return gw.process().log().find("--admin-tls-key") != std::string::npos; },
                 std::chrono::seconds(10)))
      << gw.process().log();
  EXPECT_EQ(served_serial(admin, s_client_cert), "serial=1001\n");
  key.write(slurp(pki->path("server2.key")));
  gw.process().signal(SIGHUP);
  EXPECT_TRUE(eventually([&] { return served_serial(admin, s_client_cert) == "serial=1002\n"; },
                         std::chrono::seconds(10)));
  EXPECT_EQ(curl(admin, "/admin/instances", cacert() + client_cert + key_header).status, 200);
}

// Engines over https: E -> P -> D, every hop over TLS checked against the
// CA, SNI naming the URL's host, health checks and metrics scrapes passing,
// and the keep-alive pool reusing TLS connections (10 requests, far fewer
// connections).
TEST(TlsEngines, EpdOverHttps) {
  ASSERT_TRUE(pki->ok());
  auto e = tls_sim("encode");
  auto p = tls_sim("prefill");
  auto d = tls_sim("decode");
  Gateway gw({"--encode-servers-urls", https_url(*e), "--prefill-servers-urls", https_url(*p),
              "--decode-servers-urls", https_url(*d), "--upstream-ca", pki->path("ca.pem"),
              "--health-interval", "200ms", "--metrics-interval", "200ms"});
  const std::string image =
      R"({"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}})";
  const std::string body =
      R"({"model":"sim-model","messages":[{"role":"user","content":[{"type":"text","text":"hi"},)" +
      image + R"(]}],"max_tokens":3})";
  for (int i = 0; i < 10; ++i) {
    auto r = http_request(gw.port(), "POST", "/v1/chat/completions", body,
                          {{"Content-Type", "application/json"}});
    ASSERT_EQ(r.status, 200) << r.body;
  }
  for (Sim* s : {e.get(), p.get(), d.get()}) {
    auto reqs = sim_requests(*s);
    ASSERT_EQ(reqs.size(), 10u);
    EXPECT_EQ(reqs[0]["tls_sni"], "localhost");
    EXPECT_EQ(reqs[0]["status"], 200);
  }
  // Health checks and scrapes reached the engines over TLS too.
  EXPECT_TRUE(eventually([&] {
    auto st = sim_stats(*d);
    return st.is_object() && st["requests_total"].value("/health", 0) >= 2 &&
           st["requests_total"].value("/metrics", 0) >= 2;
  }));
  // Every instance passed its checks (a failed handshake would eject it).
  auto st = gw.status();
  for (const char* role : {"encode", "prefill", "decode"}) {
    ASSERT_EQ(st["instances"][role].size(), 1u) << st.dump();
    EXPECT_EQ(st["instances"][role][0]["healthy"], true) << st.dump();
  }
}

// Bodies larger than a TLS record both ways: a 60 KB prompt from a TLS
// client through to a https engine, and a whole answer of more than 16 KB
// back (a gathering write over TLS once stopped after its first buffer).
TEST(TlsEngines, LargeBodiesCrossBothSides) {
  ASSERT_TRUE(pki->ok());
  auto d = tls_sim("both", "engine", {"--itl-ms", "0"});
  auto args = tls_listener();
  args.insert(args.end(), {"--decode", https_url(*d), "--prefill-servers-urls", "disable",
                           "--upstream-ca", pki->path("ca.pem")});
  Gateway gw(args);
  const std::string prompt(60 * 1024, 'a');
  EditedFile body("body.json", R"({"model":"sim-model","prompt":")" + prompt +
                                   R"(","max_tokens":8000,"stream":false})");
  auto r =
      curl(gw.port(), "/v1/completions",
           cacert() + " --data-binary @" + body.path() + " -H 'Content-Type: application/json'");
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 300);
  EXPECT_GT(r.body.size(), 16u * 1024);
  EXPECT_EQ(Json::parse(r.body)["usage"]["completion_tokens"], 8000);
  auto reqs = sim_requests(*d);
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_NE(reqs[0]["body"].get<std::string>().find(prompt.substr(0, 1000)), std::string::npos);
}

// Pooled TLS connections are reused: with probes off, ten requests on two
// workers open at most one connection per worker to the engine.
TEST(TlsEngines, KeepAlivePoolReusesTlsConnections) {
  ASSERT_TRUE(pki->ok());
  auto d = tls_sim("both");
  Gateway gw({"--decode", https_url(*d), "--prefill-servers-urls", "disable", "--upstream-ca",
              pki->path("ca.pem"), "--health-interval", "off", "--metrics-interval", "off"});
  for (int i = 0; i < 10; ++i)
    ASSERT_EQ(post_json(gw.port(), "/v1/completions", Json::parse(kCompletion)).status, 200);
  // The test's own GET /sim/stats is one more connection.
  EXPECT_LE(sim_stats(*d)["connections_total"].get<int>(), 3);
}

// A gateway in front of `d` alone, trusting the tests' CA: its answer
// must be a 502 error JSON naming the refused certificate (with
// --verbose-errors), and the engine must not have seen the request.
void expect_certificate_refused(const Sim& d) {
  Gateway gw({"--decode", https_url(d), "--prefill-servers-urls", "disable", "--upstream-ca",
              pki->path("ca.pem"), "--verbose-errors", "true", "--health-interval", "off"});
  auto r = post_json(gw.port(), "/v1/completions", Json::parse(kCompletion));
  EXPECT_EQ(r.status, 502) << r.body;
  auto j = Json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.body;
  EXPECT_EQ(j["error"]["type"], "BadGatewayError") << r.body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("certificate refused"), std::string::npos)
      << r.body;
  EXPECT_EQ(sim_requests(d).size(), 0u);
}

// An engine whose certificate chains to a CA the gateway does not trust is
// refused; with --upstream-insecure the same engine is used (and the log
// says so).
TEST(TlsEngines, UntrustedEngineCertificateIsRefused) {
  ASSERT_TRUE(pki->ok());
  auto d = tls_sim("both", "rogue");
  expect_certificate_refused(*d);
  Gateway insecure({"--decode", https_url(*d), "--prefill-servers-urls", "disable",
                    "--upstream-insecure", "true", "--health-interval", "off"});
  EXPECT_EQ(post_json(insecure.port(), "/v1/completions", Json::parse(kCompletion)).status, 200);
  EXPECT_NE(insecure.process().log().find("NOT verified"), std::string::npos);
}

// An engine reached by a name its certificate does not carry is refused
// (hostname verification), though its CA is trusted.
TEST(TlsEngines, HostnameMismatchIsRefused) {
  ASSERT_TRUE(pki->ok());
  // The certificate names engine.example only.
  auto d = tls_sim("both", "elsewhere");
  expect_certificate_refused(*d);
}

// A gateway whose engines all speak plain HTTP makes no TLS context at
// start; the first https:// engine added at run time gets one made then,
// and is reached through it (with --upstream-insecure: the tests' CA is
// not in the system store the context would otherwise trust).
TEST(TlsEngines, ContextIsMadeForTheFirstHttpsEngineAdded) {
  ASSERT_TRUE(pki->ok());
  Sim plain("both");
  auto secure = tls_sim("both");
  AdminGateway g({"--decode", plain.url(), "--prefill-servers-urls", "disable",
                  "--upstream-insecure", "true", "--health-interval", "off"});
  auto r = g.call("POST", "/admin/instances", {{"role", "decode"}, {"url", https_url(*secure)}});
  ASSERT_EQ(r.status, 201) << r.body;
  const auto plain_id = g.instance_by_url(plain.url())["id"].get<int>();
  ASSERT_EQ(g.call("POST", "/admin/instances/" + std::to_string(plain_id) + "/drain").status, 200);
  auto a = post_json(g.port(), "/v1/completions", Json::parse(kCompletion));
  EXPECT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(sim_requests(*secure).size(), 1u);
}

// Engines that require client certificates (the sim does not, so the
// gateway is the engine here): pdgate in front of a pdgate with
// --tls-client-ca succeeds with --upstream-cert/--upstream-key and is
// refused without.
TEST(TlsEngines, MutualTlsToEngines) {
  ASSERT_TRUE(pki->ok());
  Sim d("both");
  // The inner gateway's chain ends at the intermediate; the outer trusts
  // the root.
  auto args = tls_listener();
  args.insert(args.end(), {"--decode", d.hostport(), "--prefill-servers-urls", "disable",
                           "--tls-client-ca", pki->path("ca.pem")});
  Gateway inner(args);
  const std::string url = "https://localhost:" + std::to_string(inner.port());
  Gateway with({"--decode", url, "--prefill-servers-urls", "disable", "--upstream-ca",
                pki->path("ca.pem"), "--upstream-cert", pki->path("client.pem"), "--upstream-key",
                pki->path("client.key"), "--health-interval", "off"});
  EXPECT_EQ(post_json(with.port(), "/v1/completions", Json::parse(kCompletion)).status, 200);
  Gateway without({"--decode", url, "--prefill-servers-urls", "disable", "--upstream-ca",
                   pki->path("ca.pem"), "--health-interval", "off"});
  EXPECT_EQ(post_json(without.port(), "/v1/completions", Json::parse(kCompletion)).status, 502);
}

// Spans exported to an https:// collector (a Python TLS sink with the
// server certificate): with --otlp-ca naming the CA that signed it, the
// request's spans arrive and are counted as exported; a gateway trusting
// another CA sends none, counts them as failed and logs why.
TEST(TlsOtlp, SpansReachAnHttpsCollector) {
  ASSERT_TRUE(pki->ok());
  Process sink("otlp-sink",
               {"/usr/bin/python3", source_dir() + "/tests/integration/otlp_tls_sink.py",
                pki->path("server-chain.pem"), pki->path("server.key")});
  const auto sink_port = sink.wait_listening();
  const std::string endpoint = "https://localhost:" + std::to_string(sink_port);
  Sim d("both");
  const std::vector<std::string> common = {"--decode",
                                           d.hostport(),
                                           "--prefill-servers-urls",
                                           "disable",
                                           "--otlp-export-interval",
                                           "100ms",
                                           "--otlp-endpoint",
                                           endpoint};
  auto args = common;
  args.insert(args.end(), {"--otlp-ca", pki->path("ca.pem")});
  {
    Gateway gw(args);
    ASSERT_EQ(post_json(gw.port(), "/v1/completions", Json::parse(kCompletion)).status, 200);
    EXPECT_TRUE(eventually(
        [&] {
          return sink.log().find("\"POST /v1/completions\"") != std::string::npos &&
                 metric(gw.port(), "pdgate_trace_spans_exported_total") >= 1;
        },
        std::chrono::seconds(10)))
        << sink.log() << gw.process().log();
  }  // stopped: whatever it still had is exported before the next one starts

  args = common;
  args.insert(args.end(), {"--otlp-ca", pki->path("other-ca.pem")});
  Gateway untrusting(args);
  const auto before = sink.log().size();
  ASSERT_EQ(post_json(untrusting.port(), "/v1/completions", Json::parse(kCompletion)).status, 200);
  EXPECT_TRUE(eventually(
      [&] {
        return metric(untrusting.port(),
                      "pdgate_trace_spans_dropped_total{reason=\"export_failed\"}") >= 1;
      },
      std::chrono::seconds(10)))
      << untrusting.process().log();
  EXPECT_NE(untrusting.process().log().find("certificate refused"), std::string::npos)
      << untrusting.process().log();
  EXPECT_EQ(metric(untrusting.port(), "pdgate_trace_spans_exported_total"), 0);
  EXPECT_EQ(sink.log().find("OTLP", before), std::string::npos) << sink.log();
}

// Broken TLS settings stop pdgate at start with a message naming the file.
TEST(TlsConfig, BadFilesAreReportedAtStart) {
  ASSERT_TRUE(pki->ok());
  auto r = run("timeout 20 " + build_dir() +
               "/pdgate --port 0 --decode 127.0.0.1:1 "
               "--prefill-servers-urls disable --tls-cert " +
               pki->path("server.pem") + " --tls-key " + pki->path("client.key") + " 2>&1");
  EXPECT_NE(r.exit, 0);
  EXPECT_NE(r.out.find("--tls-key"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mismatch"), std::string::npos) << r.out;
  r = run("timeout 20 " + build_dir() +
          "/pdgate --port 0 --decode 127.0.0.1:1 "
          "--prefill-servers-urls disable --upstream-ca /nonexistent.pem 2>&1");
  EXPECT_NE(r.exit, 0);
  EXPECT_NE(r.out.find("--upstream-ca"), std::string::npos) << r.out;
}

// --check-config loads every file the configuration names, as the start
// would, and reports every problem in one run (as nginx -t does): a
// missing certificate, a key that does not match its certificate, a client
// CA that does not parse, an engine CA that is missing, an access log that
// cannot be written, a policy that does not load and a bad flag, together,
// each named, exit 1.
TEST(TlsConfig, CheckConfigLoadsEveryFile) {
  ASSERT_TRUE(pki->ok());
  const std::string pdgate = "timeout 20 " + build_dir() + "/pdgate --check-config ";
  const std::string engines = "--decode 127.0.0.1:1 --prefill-servers-urls disable ";
  // Good files: OK.
  auto r =
      run(pdgate + engines + "--tls-cert " + pki->path("server-chain.pem") + " --tls-key " +
          pki->path("server.key") + " --tls-client-ca " + pki->path("ca.pem") + " --upstream-ca " +
          pki->path("ca.pem") + " --access-log " + pki->path("check-access.log") + " 2>&1");
  EXPECT_EQ(r.exit, 0) << r.out;
  EXPECT_NE(r.out.find("configuration OK"), std::string::npos) << r.out;
  // Checking writes nothing: the access log is not created.
  EXPECT_FALSE(std::ifstream(pki->path("check-access.log")).good());

  const std::string bad_policy = pki->path("broken.lua");
  std::ofstream(bad_policy) << "return { pick = function( end }\n";
  std::ofstream(pki->path("not-a-ca.pem")) << "not a certificate\n";
  // Each file problem alone.
  struct Bad {
    std::string args;
    std::string says;
  };
  const Bad bad[] = {
      {"--tls-cert /nonexistent/cert.pem --tls-key " + pki->path("server.key"),
       "/nonexistent/cert.pem"},
      {"--tls-cert " + pki->path("server.pem") + " --tls-key " + pki->path("client.key"),
       "--tls-key"},
      {"--tls-cert " + pki->path("server-chain.pem") + " --tls-key " + pki->path("server.key") +
           " --tls-client-ca " + pki->path("not-a-ca.pem"),
       "not-a-ca.pem"},
      {"--upstream-ca /nonexistent/ca.pem", "--upstream-ca"},
      {"--admin-port 0 --admin-tls-cert " + pki->path("server.pem") + " --admin-tls-key " +
           pki->path("client.key"),
       "--admin-tls-key: cannot load the private key"},
      {"--admin-port 0 --admin-tls-cert " + pki->path("server-chain.pem") + " --admin-tls-key " +
           pki->path("server.key") + " --admin-tls-client-ca " + pki->path("not-a-ca.pem"),
       "--admin-tls-client-ca: cannot load"},
      {"--redis rediss://localhost:6379 --redis-tls-ca /nonexistent/redis-ca.pem",
       "--redis-tls-ca: cannot load"},
      {"--access-log /nonexistent-dir/access.log", "/nonexistent-dir/access.log"},
      {"--otlp-endpoint https://localhost:4318 --otlp-ca /nonexistent/otlp-ca.pem",
       "--otlp-ca: cannot load"},
  };
  for (const auto& b : bad) {
    r = run(pdgate + engines + b.args + " 2>&1");
    EXPECT_EQ(r.exit, 1) << b.args << ": " << r.out;
    EXPECT_NE(r.out.find(b.says), std::string::npos) << b.args << ": " << r.out;
    EXPECT_EQ(r.out.find("configuration OK"), std::string::npos) << r.out;
  }
  // All at once, with a policy that does not load and a bad flag: every
  // one is reported in the same run.
  r = run(pdgate + engines + "--port 70000 --policy " + bad_policy + " --tls-cert " +
          pki->path("server.pem") + " --tls-key " + pki->path("client.key") +
          " --upstream-ca /nonexistent/ca.pem --access-log /nonexistent-dir/access.log 2>&1");
  EXPECT_EQ(r.exit, 1) << r.out;
  for (const char* says :
       {"--port", "broken.lua", "--tls-key", "--upstream-ca", "/nonexistent-dir/access.log"}) {
    EXPECT_NE(r.out.find(says), std::string::npos) << says << " not in: " << r.out;
  }
}

}  // namespace
}  // namespace pdgate::test
