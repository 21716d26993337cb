// The three command lines of vLLM's example proxies, as written in vLLM's
// examples, start pdgate and serve requests; plus --config and --help.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

// A free port for a command line that must name one (the seeds do).
std::uint16_t free_port() { return closed_port(); }

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
  Process gw("pdgate", {build_dir() + "/pdgate", "--model", "sim-model", "--prefill",
                        "localhost:" + std::to_string(p1.port()),
                        "localhost:" + std::to_string(p2.port()), "--decode",
                        "localhost:" + std::to_string(d1.port()),
                        "localhost:" + std::to_string(d2.port()), "--port",
                        std::to_string(port)});
  EXPECT_EQ(gw.wait_listening(), port);
  expect_serves(port, d1);
  EXPECT_FALSE(p1.requests().empty());
  EXPECT_FALSE(p2.requests().empty());
}

// disagg_proxy_multiturn.py: --host --port --prefiller-host --prefiller-port
// --decoder-host --decoder-port (and the plural spellings with lists).
TEST(SeedCommandLines, MultiTurnProxy) {
  Sim p("prefill"), d1("decode"), d2("decode");
  const auto port = free_port();
  Process gw("pdgate", {build_dir() + "/pdgate", "--host", "0.0.0.0", "--port",
                        std::to_string(port), "--prefiller-host", "127.0.0.1",
                        "--prefiller-port", std::to_string(p.port()), "--decoder-hosts",
                        "127.0.0.1", "127.0.0.1", "--decoder-ports", std::to_string(d1.port()),
                        std::to_string(d2.port())});
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
                        "--prefill-servers-urls", "disable", "--decode-servers-urls",
                        pd.url()});
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
  Process gw("pdgate", {build_dir() + "/pdgate", "--config", path, "--host", "127.0.0.1",
                        "--port", std::to_string(port)});
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

}  // namespace
}  // namespace pdgate::test
