// The three command lines of vLLM's example proxies, as written in vLLM's
// examples, start pdgate and serve requests; plus --config and --help.
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <future>

#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

// A free port for a command line that must name one (the seeds do).
std::uint16_t free_port() {
  return closed_port();
}

Json chat(bool stream) {
  return {{"model", "sim-model"},
          {"messages", {{{"role", "user"}, {"content", "hi"}}}},
          {"max_tokens", 3},
          {"stream", stream}};
}

void expect_serves(std::uint16_t port, Sim& decode) {
  auto r = post_json(port, "/v1/chat/completions", chat(true));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(sse_data(r.body).back(), "[DONE]");
  auto nr = post_json(port, "/v1/chat/completions", chat(false));
  ASSERT_EQ(nr.status, 200) << nr.body;
  EXPECT_FALSE(decode.requests().empty());
}

// disagg_proxy_demo.py: --model M --prefill h:p h:p --decode h:p h:p --port P
TEST(SeedCommandLines, XpYdDemoProxy) {
  Sim p1("prefill"), p2("prefill"), d1("decode"), d2("decode");
  const auto port = free_port();
  Process gw("pdgate",
             {build_dir() + "/pdgate", "--model", "sim-model", "--prefill",
              "localhost:" + std::to_string(p1.port()), "localhost:" + std::to_string(p2.port()),
              "--decode", "localhost:" + std::to_string(d1.port()),
              "localhost:" + std::to_string(d2.port()), "--port", std::to_string(port)});
  EXPECT_EQ(gw.wait_listening(), port);
  expect_serves(port, d1);
  EXPECT_FALSE(p1.requests().empty());
  EXPECT_FALSE(p2.requests().empty());
}

// Engines named by IPv6 address, in the URL and the bare form: pdgate
// reaches both over ::1 and serves (the engines listen on "::", which
// takes IPv4 too, so the harness can still read their request logs).
TEST(SeedCommandLines, Ipv6EngineAddresses) {
  if (!have_ipv6_loopback())
    GTEST_SKIP() << "no IPv6 loopback on this machine";
  Sim p("prefill", {"--host", "::"}), d("decode", {"--host", "::"});
  const auto port = free_port();
  Process gw("pdgate", {build_dir() + "/pdgate", "--model", "sim-model", "--prefill",
                        "http://[::1]:" + std::to_string(p.port()) + "/", "--decode",
                        "[::1]:" + std::to_string(d.port()), "--port", std::to_string(port)});
  EXPECT_EQ(gw.wait_listening(), port);
  expect_serves(port, d);
  EXPECT_FALSE(p.requests().empty());
}

// disagg_proxy_multiturn.py: --host --port --prefiller-host --prefiller-port
// --decoder-host --decoder-port (and the plural spellings with lists).
TEST(SeedCommandLines, MultiTurnProxy) {
  Sim p("prefill"), d1("decode"), d2("decode");
  const auto port = free_port();
  Process gw("pdgate", {build_dir() + "/pdgate", "--host", "0.0.0.0", "--port",
                        std::to_string(port), "--prefiller-host", "127.0.0.1", "--prefiller-port",
                        std::to_string(p.port()), "--decoder-hosts", "127.0.0.1", "127.0.0.1",
                        "--decoder-ports", std::to_string(d1.port()), std::to_string(d2.port())});
  EXPECT_EQ(gw.wait_listening(), port);
  expect_serves(port, d1);
  EXPECT_FALSE(d2.requests().empty());
}

// disagg_epd_proxy.py with --prefill-servers-urls disable: one hop to a
// combined P+D instance, the body forwarded untouched.
TEST(SeedCommandLines, EpdProxyWithPrefillDisabled) {
  Sim e("encode"), pd("both");
  const auto port = free_port();
  Process gw("pdgate", {build_dir() + "/pdgate", "--host", "0.0.0.0", "--port",
                        std::to_string(port), "--encode-servers-urls", e.url(),
                        "--prefill-servers-urls", "disable", "--decode-servers-urls", pd.url()});
  EXPECT_EQ(gw.wait_listening(), port);
  Json body = chat(false);
  body["min_tokens"] = 1;
  auto r = post_json(port, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  auto seen = pd.requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(Json::parse(seen[0]["body"].get<std::string>()), body);
  expect_serves(port, pd);
}

// disagg_epd_proxy.py for E + P + D, as in vLLM's usage example: a
// multimodal request goes to an encoder, then prefill, then decode.
TEST(SeedCommandLines, EpdProxyEncodePrefillDecode) {
  Sim e1("encode"), e2("encode"), p1("prefill"), p2("prefill"), d1("decode"), d2("decode");
  const auto port = free_port();
  Process gw("pdgate",
             {build_dir() + "/pdgate", "--host", "0.0.0.0", "--port", std::to_string(port),
              "--encode-servers-urls", e1.url() + "," + e2.url(), "--prefill-servers-urls",
              p1.url() + "," + p2.url(), "--decode-servers-urls", d1.url() + "," + d2.url()});
  EXPECT_EQ(gw.wait_listening(), port);
  Json body = chat(false);
  body["messages"][0]["content"] = Json::array(
      {{{"type", "text"}, {"text", "what is this?"}},
       {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,AAAA"}}}}});
  auto r = post_json(port, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(e1.requests().size() + e2.requests().size(), 1u);
  EXPECT_EQ(p1.requests().size() + p2.requests().size(), 1u);
  EXPECT_EQ(d1.requests().size() + d2.requests().size(), 1u);
}

// --config loads a YAML file; a flag given too overrides the file.
TEST(Config, YamlFileWithFlagOverride) {
  Sim p("prefill"), d("decode");
  const std::string path = "/tmp/pdgate-cli-test-" + std::to_string(getpid()) + ".yaml";
  {
    std::ofstream f(path);
    f << "port: 1\nprefill:\n  - " << p.hostport() << "\ndecode:\n  - " << d.hostport()
      << "\nworkers: 1\n";
  }
  const auto port = free_port();
  Process gw("pdgate", {build_dir() + "/pdgate", "--config", path, "--host", "127.0.0.1", "--port",
                        std::to_string(port)});
  EXPECT_EQ(gw.wait_listening(), port);
  expect_serves(port, d);
  EXPECT_FALSE(p.requests().empty());
  std::remove(path.c_str());
}

// --help explains the flags and exits 0; a bad flag exits non-zero.
TEST(Config, HelpAndBadFlag) {
  {
    Process help("pdgate", {build_dir() + "/pdgate", "--help"});
    EXPECT_EQ(help.wait(), 0);
  }
  Process bad("pdgate", {build_dir() + "/pdgate", "--no-such-flag"});
  int st = bad.wait();
  ASSERT_NE(st, -1);
  EXPECT_NE(WEXITSTATUS(st), 0);
  EXPECT_NE(bad.log().find("--no-such-flag"), std::string::npos) << bad.log();
}

// Runs pdgate with `args` (shell words) to completion: its exit status
// and everything it printed (stdout and stderr).
std::pair<int, std::string> run_pdgate(const std::string& args) {
  std::string out;
  FILE* p = ::popen((build_dir() + "/pdgate " + args + " 2>&1").c_str(), "r");
  if (p == nullptr)
    return {-1, ""};
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// --version prints the version and exits 0.
TEST(Config, Version) {
  const auto [code, out] = run_pdgate("--version");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out.rfind("pdgate 0.", 0), 0u) << out;
  EXPECT_NE(out.find("LuaJIT"), std::string::npos) << out;
}

// --check-config accepts the shipped example (naming each stage's policy)
// without serving, and rejects each kind of mistake with exit 1 and a
// message naming it: a bad value in the file, a flag, a missing role, a
// policy script that does not load.
TEST(Config, CheckConfig) {
  const std::string example = source_dir() + "/config/pdgate.example.yaml";
  auto [code, out] = run_pdgate("--check-config --config " + example);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("configuration OK"), std::string::npos) << out;
  EXPECT_NE(out.find("policies prefill="), std::string::npos) << out;
  EXPECT_EQ(out.find("listening"), std::string::npos) << out;

  const std::string dir = ::testing::TempDir() + "/pdgate-check-" + std::to_string(::getpid());
  std::system(("mkdir -p " + dir).c_str());
  std::ofstream(dir + "/bad-duration.yaml") << "decode: [localhost:8200]\nconnect-timeout: soon\n";
  std::ofstream(dir + "/no-decode.yaml") << "prefill: [localhost:8100]\n";
  std::ofstream(dir + "/broken.lua") << "return { pick = function( end }\n";
  std::ofstream(dir + "/keys.yaml") << "keys:\n  - name: a\n    sha256: nothex\n";
  struct Bad {
    std::string args;
    std::string says;
  };
  const Bad bad[] = {
      {"--config " + dir + "/bad-duration.yaml", "connect-timeout"},
      {"--config " + dir + "/no-decode.yaml", "no decode instances"},
      {"--decode localhost:8200 --port 70000", "port"},
      {"--prefill localhost:8100 --decode localhost:8200 --policy " + dir + "/broken.lua",
       "broken.lua"},
      {"--config " + dir + "/missing.yaml", "missing.yaml"},
      {"--prefill localhost:8100 --decode localhost:8200 --api-keys " + dir + "/keys.yaml",
       "64 hex digits"},
      {"--prefill localhost:8100 --decode localhost:8200 --api-keys-from-redis true",
       "needs --redis"},
  };
  for (const auto& b : bad) {
    std::tie(code, out) = run_pdgate("--check-config " + b.args);
    EXPECT_NE(code, 0) << b.args << ": " << out;
    EXPECT_NE(out.find(b.says), std::string::npos) << b.args << ": " << out;
    EXPECT_EQ(out.find("configuration OK"), std::string::npos) << out;
  }
}

// --check-config names instances found in DNS as such, not as "0
// instances": they are resolved only when pdgate runs.
TEST(Config, CheckConfigNamesDnsSources) {
  const auto [code, out] = run_pdgate(
      "--check-config --prefill dns://prefill.engines.test:8100 --decode "
      "dns://decode.engines.test:8200 127.0.0.1:8201 --dns-server 127.0.0.1:53");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("dns://prefill.engines.test:8100"), std::string::npos) << out;
  EXPECT_NE(out.find("dns://decode.engines.test:8200"), std::string::npos) << out;
  EXPECT_NE(out.find("1 decode"), std::string::npos) << out;
}

// --check-config reports every mistake of a config at once (file keys,
// flags, cross-field rules, an instance listed twice, a bad labelled
// entry), each named, and exits 1 without resolving or contacting anything.
TEST(Config, CheckConfigReportsEveryError) {
  const std::string dir = ::testing::TempDir() + "/pdgate-check-all-" + std::to_string(::getpid());
  std::system(("mkdir -p " + dir).c_str());
  std::ofstream(dir + "/many.yaml") << "prefill: [localhost:8100]\n"
                                       "decode:\n"
                                       "  - localhost:8200\n"
                                       "  - http://localhost:8200/\n"
                                       "  - {url: 'no-such-host.invalid:8201', weight: 0}\n"
                                       "connect-timeout: soon\n"
                                       "colour: blue\n"
                                       "max-header-size: 10\n";
  const auto [code, out] =
      run_pdgate("--check-config --config " + dir + "/many.yaml --retry-budget 3 --port 70000");
  EXPECT_EQ(code, 1) << out;
  for (const char* says : {"connect-timeout", "'colour'", "weight must be an integer",
                           "listed twice", "--retry-budget", "--port", "--max-header-size"}) {
    EXPECT_NE(out.find(says), std::string::npos) << says << " not in: " << out;
  }
  EXPECT_EQ(out.find("configuration OK"), std::string::npos) << out;
  // One line per error, each marked as pdgate's.
  EXPECT_NE(out.find("\npdgate: --port"), std::string::npos) << out;
  std::system(("rm -rf " + dir).c_str());
}

// --workers N runs N serving threads (reported by /status and visible as
// threads of the process).
TEST(Config, WorkersFlag) {
  Sim d("both");
  Gateway gw({"--decode", d.hostport(), "--prefill-servers-urls", "disable", "--workers", "3"});
  EXPECT_EQ(gw.status()["workers"], 3);
  auto count_threads = [&] {
    int threads = 0;
    if (DIR* dir = opendir(("/proc/" + std::to_string(gw.process().pid()) + "/task").c_str())) {
      while (dirent* e = readdir(dir))
        threads += e->d_name[0] != '.';
      closedir(dir);
    }
    return threads;
  };
  // Three workers and the main thread; the workers start as the listener
  // opens, so the last may still be starting when the first answers.
  EXPECT_TRUE(eventually([&] { return count_threads() >= 4; }, std::chrono::seconds(2)))
      << count_threads();
}

// SIGTERM stops accepting but lets a stream in flight finish, then exits 0.
TEST(Shutdown, SigtermDrainsInFlightStreams) {
  Sim p("prefill"), d("decode", {"--itl-ms", "20"});
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  Connection c(gw.port());
  Json body = chat(true);
  body["max_tokens"] = 30;
  c.send_request("POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(c.read_head().status, 200);
  std::string got = c.read_body_some();
  gw.process().signal(SIGTERM);
  for (;;) {
    auto piece = c.read_body_some(std::chrono::seconds(10));
    if (piece.empty())
      break;
    got += piece;
  }
  auto events = sse_data(got);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  int st = gw.process().wait(std::chrono::seconds(10));
  ASSERT_NE(st, -1);
  EXPECT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
}

// --shutdown-timeout bounds the drain: a stream that would run for a
// minute is cut at the deadline and pdgate exits 0.
TEST(Shutdown, ShutdownTimeoutCutsLongStreams) {
  Sim p("prefill"), d("decode", {"--itl-ms", "100"});
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport(), "--shutdown-timeout", "1s"});
  Connection c(gw.port());
  Json body = chat(true);
  body["max_tokens"] = 600;  // 60 s of tokens
  c.send_request("POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(c.read_head().status, 200);
  std::string got = c.read_body_some();
  gw.process().signal(SIGTERM);
  // Exits within the deadline plus a generous margin, far below the
  // stream's length and the 30 s default.
  int st = gw.process().wait(std::chrono::seconds(15));
  ASSERT_NE(st, -1) << "pdgate still running 15 s after SIGTERM with --shutdown-timeout 1s";
  EXPECT_TRUE(WIFEXITED(st)) << "killed by signal " << WTERMSIG(st) << "; log:\n"
                             << gw.process().log();
  EXPECT_EQ(WEXITSTATUS(st), 0);
  try {
    for (std::string piece; !(piece = c.read_body_some(std::chrono::seconds(5))).empty();)
      got += piece;
  } catch (const std::exception&) {
    // cut mid-stream, as expected
  }
  auto events = sse_data(got);
  EXPECT_TRUE(events.empty() || events.back() != "[DONE]") << "the stream was not cut";
}

}  // namespace
}  // namespace pdgate::test
