#include "core/config/config.hpp"
#include "core/config/detail/option_table.hpp"

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace pdgate {
namespace {

Result<CommandLine> parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv{"pdgate"};
  argv.insert(argv.end(), args.begin(), args.end());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

std::vector<std::string> urls(const std::vector<UpstreamSpec>& list) {
  std::vector<std::string> out;
  for (const auto& u : list)
    out.push_back(u.url);
  return out;
}

// Expects a failure whose message contains every fragment.
void expect_error(const Result<CommandLine>& r, std::initializer_list<std::string> fragments) {
  ASSERT_FALSE(r.ok()) << "unexpectedly parsed";
  for (const auto& f : fragments) {
    EXPECT_NE(r.error().find(f), std::string::npos) << "'" << f << "' not in: " << r.error();
  }
}

// A temporary YAML file, removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    path_ = (std::filesystem::temp_directory_path() /
             ("pdgate_config_test_" + std::to_string(::getpid()) + "_" +
              std::to_string(counter_++) + ".yaml"))
                .string();
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const char* path() const { return path_.c_str(); }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

// --- The three seed command lines -----------------------------------------

// disagg_proxy_demo.py's command line (README form) parses to its instances and port.
TEST(ConfigSeeds, DemoProxy) {
  const auto r =
      parse({"--model", "meta-llama/Llama-3.1-8B-Instruct", "--prefill", "localhost:8100",
             "localhost:8101", "--decode", "localhost:8200", "localhost:8201", "--port", "8000"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Config& c = r->config;
  EXPECT_FALSE(r->help);
  EXPECT_EQ(c.model, "meta-llama/Llama-3.1-8B-Instruct");
  EXPECT_EQ(urls(c.prefill),
            (std::vector<std::string>{"http://localhost:8100", "http://localhost:8101"}));
  EXPECT_EQ(urls(c.decode),
            (std::vector<std::string>{"http://localhost:8200", "http://localhost:8201"}));
  EXPECT_EQ(c.port, 8000);
  EXPECT_EQ(c.host, "0.0.0.0");
  EXPECT_EQ(c.prefill[1].role, Role::prefill);
  EXPECT_EQ(c.decode[0].role, Role::decode);
  EXPECT_EQ(c.decode[0].host, "localhost");
  EXPECT_EQ(c.decode[0].port, 8200);
}

// dns://NAME:PORT in an instance list is a DNS source of that role, not an
// instance: a role fed only by DNS may start with none; static and DNS
// entries mix; bad names and missing ports are refused.
TEST(ConfigDns, Sources) {
  const auto r = parse({"--prefill", "dns://prefill-headless.ns.svc.cluster.local:8100", "--decode",
                        "localhost:8200", "dns://decode-headless:8200", "--dns-interval", "2s",
                        "--dns-server", "10.96.0.10:53"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Config& c = r->config;
  EXPECT_TRUE(c.prefill.empty());
  EXPECT_EQ(urls(c.decode), (std::vector<std::string>{"http://localhost:8200"}));
  ASSERT_EQ(c.dns_sources.size(), 2u);
  EXPECT_EQ(c.dns_sources[0].role, Role::prefill);
  EXPECT_EQ(c.dns_sources[0].name, "prefill-headless.ns.svc.cluster.local");
  EXPECT_EQ(c.dns_sources[0].port, 8100);
  EXPECT_EQ(c.dns_sources[1].text(), "dns://decode-headless:8200");
  EXPECT_EQ(c.dns_interval, std::chrono::seconds(2));
  EXPECT_EQ(c.dns_server, "10.96.0.10:53");
  expect_error(parse({"--decode", "dns://decode-headless"}), {"missing port"});
  expect_error(parse({"--decode", "dns://bad_name!:8200"}), {"DNS source", "invalid host name"});
  expect_error(parse({"--decode", "dns://d:0"}), {"DNS source"});
  expect_error(parse({"--prefill-servers-urls", "disable", "--prefill", "dns://p:8100", "--decode",
                      "localhost:8200"}),
               {"dns:// prefill source"});
}

// The demo proxy's short flags -m/-p/-d work the same.
TEST(ConfigSeeds, DemoProxyShortFlags) {
  const auto r = parse({"-m", "m", "-p", "a:1", "-d", "b:2", "c:3"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.model, "m");
  EXPECT_EQ(urls(r->config.prefill), (std::vector<std::string>{"http://a:1"}));
  EXPECT_EQ(urls(r->config.decode), (std::vector<std::string>{"http://b:2", "http://c:3"}));
}

// disagg_proxy_multiturn.py's usage line parses to one prefill and one decode instance.
TEST(ConfigSeeds, MultiTurnProxy) {
  const auto r =
      parse({"--host", "0.0.0.0", "--port", "8000", "--prefiller-host", "10.0.0.1",
             "--prefiller-port", "8100", "--decoder-host", "10.0.0.2", "--decoder-port", "8200"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(urls(r->config.prefill), (std::vector<std::string>{"http://10.0.0.1:8100"}));
  EXPECT_EQ(urls(r->config.decode), (std::vector<std::string>{"http://10.0.0.2:8200"}));
  EXPECT_EQ(r->config.decode[0].host, "10.0.0.2");
}

// The multi-turn plural aliases take several hosts and ports, zipped pairwise.
TEST(ConfigSeeds, MultiTurnPluralForms) {
  const auto r = parse({"--prefiller-hosts", "p1", "p2", "--prefiller-ports", "8100", "8101",
                        "--decoder-hosts", "d1", "::1", "--decoder-ports", "8200", "8201"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(urls(r->config.prefill),
            (std::vector<std::string>{"http://p1:8100", "http://p2:8101"}));
  EXPECT_EQ(urls(r->config.decode),
            (std::vector<std::string>{"http://d1:8200", "http://[::1]:8201"}));
  EXPECT_EQ(r->config.decode[1].host, "::1");
}

// With only some multi-turn flags, the Python defaults (localhost, 8100/8200) fill the rest.
TEST(ConfigSeeds, MultiTurnDefaults) {
  auto r = parse({"--decoder-host", "10.0.0.2"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(urls(r->config.prefill), (std::vector<std::string>{"http://localhost:8100"}));
  EXPECT_EQ(urls(r->config.decode), (std::vector<std::string>{"http://10.0.0.2:8200"}));
  r = parse({"--prefiller-port", "9100"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(urls(r->config.prefill), (std::vector<std::string>{"http://localhost:9100"}));
  EXPECT_EQ(urls(r->config.decode), (std::vector<std::string>{"http://localhost:8200"}));
}

// Multi-turn defaults do not add instances to a role another form already gave.
TEST(ConfigSeeds, MultiTurnDefaultsOnlyForEmptyLists) {
  const auto r = parse({"--prefill", "p:1", "--decoder-host", "d"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(urls(r->config.prefill), (std::vector<std::string>{"http://p:1"}));
  EXPECT_EQ(urls(r->config.decode), (std::vector<std::string>{"http://d:8200"}));
}

// Host and port counts that differ give the Python proxy's error.
TEST(ConfigSeeds, MultiTurnCountMismatch) {
  expect_error(parse({"--prefiller-hosts", "a", "b", "--prefiller-ports", "1"}),
               {"Number of prefiller hosts must match ports"});
  expect_error(parse({"--decoder-port", "1", "2"}), {"Number of decoder hosts must match ports"});
}

// The EPD proxy's E+PD example: prefill "disable" means one hop to combined instances.
TEST(ConfigSeeds, EpdDisabledPrefill) {
  const auto r =
      parse({"--encode-servers-urls", "http://e1:8001,http://e2:8002", "--prefill-servers-urls",
             "disable", "--decode-servers-urls", "http://pd1:8003,http://pd2:8004"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Config& c = r->config;
  EXPECT_TRUE(c.prefill_disabled);
  EXPECT_TRUE(c.prefill.empty());
  EXPECT_EQ(urls(c.encode), (std::vector<std::string>{"http://e1:8001", "http://e2:8002"}));
  EXPECT_EQ(c.encode[0].role, Role::encode);
  EXPECT_EQ(urls(c.decode), (std::vector<std::string>{"http://pd1:8003", "http://pd2:8004"}));
}

// The EPD proxy's E+P+D example gives all three lists.
TEST(ConfigSeeds, EpdFull) {
  const auto r = parse({"--encode-servers-urls", "http://e1:8001,http://e2:8001",
                        "--prefill-servers-urls", "http://p1:8003,http://p2:8004",
                        "--decode-servers-urls", "http://d1:8005,http://d2:8006"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_FALSE(r->config.prefill_disabled);
  EXPECT_EQ(urls(r->config.prefill),
            (std::vector<std::string>{"http://p1:8003", "http://p2:8004"}));
  EXPECT_EQ(urls(r->config.decode), (std::vector<std::string>{"http://d1:8005", "http://d2:8006"}));
}

// The EPD launch script's form (quoted host and port, localhost URLs) parses.
TEST(ConfigSeeds, EpdLaunchScript) {
  const auto r =
      parse({"--host", "0.0.0.0", "--port", "10001", "--encode-servers-urls",
             "http://localhost:19534", "--prefill-servers-urls", "http://localhost:19535",
             "--decode-servers-urls", "http://localhost:19536"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.port, 10001);
  EXPECT_EQ(urls(r->config.prefill), (std::vector<std::string>{"http://localhost:19535"}));
}

// "none", "NONE" and "" disable prefill too; commas, spaces and empty items are tolerated.
TEST(ConfigSeeds, EpdDisableSpellingsAndSplitting) {
  for (const char* word : {"none", "NONE", "", "Disable"}) {
    const auto r = parse(
        {"--prefill-servers-urls", word, "--decode-servers-urls", " http://d:1 , ,http://:2/ ,"});
    ASSERT_TRUE(r.ok()) << word << ": " << r.error();
    EXPECT_TRUE(r->config.prefill_disabled) << word;
    EXPECT_EQ(urls(r->config.decode),
              (std::vector<std::string>{"http://d:1", "http://localhost:2"}));
  }
}

// --- Syntax ------------------------------------------------------------------

// --flag=value works for single, list and short flags, and underscores equal dashes.
TEST(ConfigSyntax, EqualsForms) {
  const auto r = parse({"--port=9000", "--prefill=a:1", "b:2", "-d=c:3", "-mname",
                        "--log_level=debug", "--max-body-size=1MiB", "--host=::"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.port, 9000);
  EXPECT_EQ(urls(r->config.prefill), (std::vector<std::string>{"http://a:1", "http://b:2"}));
  EXPECT_EQ(urls(r->config.decode), (std::vector<std::string>{"http://c:3"}));
  EXPECT_EQ(r->config.model, "name");
  EXPECT_EQ(r->config.log_level, "debug");
  EXPECT_EQ(r->config.max_body_bytes, 1u << 20);
  EXPECT_EQ(r->config.host, "::");
}

// A repeated flag replaces its earlier values, as argparse does.
TEST(ConfigSyntax, RepeatedFlagReplaces) {
  const auto r = parse(
      {"--decode", "a:1", "--prefill", "p:1", "--decode", "b:2", "--port", "1", "--port", "2"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(urls(r->config.decode), (std::vector<std::string>{"http://b:2"}));
  EXPECT_EQ(r->config.port, 2);
}

// Every limit and timeout flag reaches its field, with each accepted unit.
TEST(ConfigSyntax, LimitsAndTimeouts) {
  const auto r = parse({"--decode",
                        "d:1",
                        "--prefill",
                        "p:1",
                        "--workers",
                        "4",
                        "--max-body-size",
                        "2G",
                        "--max-header-size",
                        "32KiB",
                        "--header-timeout",
                        "500ms",
                        "--client-idle-timeout",
                        "2m",
                        "--connect-timeout",
                        "3",
                        "--first-byte-timeout",
                        "1.5s",
                        "--upstream-idle-timeout",
                        "1h",
                        "--upstream-max-idle",
                        "0",
                        "--kv-connector",
                        "P2pNcclConnector",
                        "--log-level",
                        "WARNING"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Config& c = r->config;
  using std::chrono::milliseconds;
  EXPECT_EQ(c.workers, 4u);
  EXPECT_EQ(c.max_body_bytes, std::size_t{2} << 30);
  EXPECT_EQ(c.max_header_bytes, 32u << 10);
  EXPECT_EQ(c.header_timeout, milliseconds(500));
  EXPECT_EQ(c.client_idle_timeout, milliseconds(120'000));
  EXPECT_EQ(c.connect_timeout, milliseconds(3'000));
  EXPECT_EQ(c.first_byte_timeout, milliseconds(1'500));
  EXPECT_EQ(c.upstream_idle_timeout, milliseconds(3'600'000));
  EXPECT_EQ(c.upstream_max_idle, 0u);
  EXPECT_EQ(c.kv_connector, "p2p-nccl");
  EXPECT_EQ(c.log_level, "warn");
}

// How long a policy's pdgate.RECHECK waits per replica ahead: 10ms by default, 0 asks again
// at once, and more than 50ms is refused (8 slots of it would hold a request 400ms).
TEST(ConfigSyntax, LoadSyncRecheckSlot) {
  using std::chrono::milliseconds;
  auto r = parse({"--prefill", "p:1", "--decode", "d:2"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.load_sync_recheck_slot, milliseconds(10));
  r = parse({"--prefill", "p:1", "--decode", "d:2", "--load-sync-recheck-slot", "0"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.load_sync_recheck_slot, milliseconds(0));
  r = parse({"--prefill", "p:1", "--decode", "d:2", "--load-sync-recheck-slot", "25ms"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.load_sync_recheck_slot, milliseconds(25));
  expect_error(parse({"--prefill", "p:1", "--decode", "d:2", "--load-sync-recheck-slot", "60ms"}),
               {"--load-sync-recheck-slot must be at most 50ms", "60ms"});
}

// Without flags beyond the engines, every field keeps its documented default.
TEST(ConfigSyntax, Defaults) {
  const auto r = parse({"--prefill", "p:1", "--decode", "d:2"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Config d;
  const Config& c = r->config;
  EXPECT_EQ(c.host, "0.0.0.0");
  EXPECT_EQ(c.port, 8000);
  EXPECT_EQ(c.workers, 0u);
  EXPECT_EQ(c.max_body_bytes, 64u << 20);
  EXPECT_EQ(c.max_header_bytes, 64u << 10);
  EXPECT_EQ(c.header_timeout, d.header_timeout);
  EXPECT_EQ(c.first_byte_timeout, std::chrono::milliseconds(600'000));
  EXPECT_EQ(c.kv_connector, "nixl");
  EXPECT_EQ(c.log_level, "info");
  EXPECT_TRUE(c.encode.empty());
  EXPECT_FALSE(c.prefill_disabled);
}

// --conversation-scope-header is stored lowercase (header lookups are
// case-insensitive); without it the scope is the credential (empty).
TEST(ConfigSyntax, ConversationScopeHeader) {
  const auto d = parse({"--prefill", "p:1", "--decode", "d:2"});
  ASSERT_TRUE(d.ok()) << d.error();
  EXPECT_EQ(d->config.conversation_scope_header, "");
  const auto r =
      parse({"--prefill", "p:1", "--decode", "d:2", "--conversation-scope-header", "X-Tenant-Id"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.conversation_scope_header, "x-tenant-id");
}

// --port 0 (ephemeral) is allowed for the listener.
TEST(ConfigSyntax, ListenerPortZero) {
  const auto r = parse({"--port", "0", "--prefill", "p:1", "--decode", "d:2"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.port, 0);
}

// -h and --help ask for help even next to mistakes.
TEST(ConfigSyntax, Help) {
  for (const char* flag : {"-h", "--help"}) {
    const auto r = parse({"--bogus", flag});
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_TRUE(r->help);
  }
}

// --- Errors --------------------------------------------------------------------

// An unknown flag is named and --help suggested.
TEST(ConfigErrors, UnknownFlag) {
  expect_error(parse({"--decode", "d:1", "--frobnicate", "3"}), {"--frobnicate", "--help"});
  expect_error(parse({"-x"}), {"-x", "--help"});
}

// A positional argument is rejected.
TEST(ConfigErrors, PositionalArgument) {
  expect_error(parse({"extra"}), {"extra"});
  expect_error(parse({"--port", "1", "2"}), {"'2'"});
}

// A flag without its value (at the end or before another flag) is an error naming it.
TEST(ConfigErrors, MissingValue) {
  expect_error(parse({"--decode", "d:1", "--port"}), {"missing value", "--port"});
  expect_error(parse({"--decode", "--port", "1"}), {"missing value", "--decode"});
  expect_error(parse({"--model", "-p", "a:1"}), {"missing value", "--model"});
}

// Bad numbers, sizes, durations and enumerations are errors naming the flag.
TEST(ConfigErrors, BadValues) {
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases = {
      {{"--port", "abc"}, "--port"},
      {{"--port", "65536"}, "--port"},
      {{"--port", "-1"}, "--port"},
      {{"--workers", "many"}, "--workers"},
      {{"--workers", "1025"}, "--workers"},
      {{"--max-body-size", "12XB"}, "--max-body-size"},
      {{"--max-body-size", "0"}, "--max-body-size"},
      {{"--max-header-size", "100"}, "--max-header-size"},
      {{"--header-timeout", "5 fortnights"}, "--header-timeout"},
      {{"--connect-timeout", "0"}, "--connect-timeout"},
      {{"--connect-timeout", "0.0001"}, "--connect-timeout"},
      {{"--log-level", "loud"}, "--log-level"},
      {{"--kv-connector", "carrier-pigeon"}, "--kv-connector"},
      {{"--upstream-max-idle", "-3"}, "--upstream-max-idle"},
      {{"--prefiller-port", "0"}, "--prefiller-port"},
      {{"--decoder-port", "x"}, "--decoder-port"},
      {{"--conversation-scope-header", "x tenant"}, "--conversation-scope-header"},
      {{"--conversation-scope-header", "x-tenant:"}, "--conversation-scope-header"},
  };
  for (const auto& [args, flag] : cases) {
    std::vector<const char*> argv{"pdgate", "--prefill", "p:1", "--decode", "d:2"};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = parse_command_line(static_cast<int>(argv.size()), argv.data());
    ASSERT_FALSE(r.ok()) << args[0] << " " << args[1];
    EXPECT_NE(r.error().find(flag), std::string::npos) << r.error();
  }
}

// Without any decode instance the error lists the three ways to give one.
TEST(ConfigErrors, NoDecode) {
  expect_error(parse({}),
               {"no decode instances", "--decode", "--decoder-host", "--decode-servers-urls"});
  expect_error(parse({"--prefill", "p:1"}), {"no decode instances"});
}

// Without prefill instances (and prefill not disabled) the error says how to fix it.
TEST(ConfigErrors, NoPrefill) {
  expect_error(parse({"--decode", "d:1"}), {"no prefill instances", "disable"});
  // With the connector set to none, one hop needs no prefill list.
  EXPECT_TRUE(parse({"--decode", "d:1", "--kv-connector", "none"}).ok());
}

// Disabling prefill while also naming prefill instances is contradictory.
TEST(ConfigErrors, DisabledPrefillWithInstances) {
  expect_error(parse({"--prefill-servers-urls", "none", "--prefill", "p:1", "--decode", "d:1"}),
               {"--prefill-servers-urls"});
}

// Upstream address errors reach the user with the flag and the reason.
TEST(ConfigErrors, BadUpstreamInFlag) {
  expect_error(parse({"--decode", "ftp://d:1"}), {"--decode", "ftp", "http:// or https://"});
  expect_error(parse({"--decode-servers-urls", "http://d"}), {"--decode-servers-urls", "port"});
  expect_error(parse({"--prefill", "p:0", "--decode", "d:1"}), {"--prefill", "port"});
}

// --- parse_upstream ----------------------------------------------------------------

// Accepted address forms normalize to http://host:port.
TEST(ParseUpstream, AcceptedForms) {
  const std::vector<std::tuple<std::string, std::string, std::string, int>> ok = {
      {"localhost:8100", "http://localhost:8100", "localhost", 8100},
      {"http://10.0.0.1:8100", "http://10.0.0.1:8100", "10.0.0.1", 8100},
      {"http://10.0.0.1:8100/", "http://10.0.0.1:8100", "10.0.0.1", 8100},
      {"HTTP://Host-1.example:1", "http://Host-1.example:1", "Host-1.example", 1},
      {"[::1]:8100", "http://[::1]:8100", "::1", 8100},
      {"http://[fe80::1]:65535/", "http://[fe80::1]:65535", "fe80::1", 65535},
      {"http://:8100", "http://localhost:8100", "localhost", 8100},
      {":8100", "http://localhost:8100", "localhost", 8100},
      {"  d:2  ", "http://d:2", "d", 2},
      {"https://d:1", "https://d:1", "d", 1},
      {"HTTPS://[::1]:8443/", "https://[::1]:8443", "::1", 8443},
      {"https://:8001", "https://localhost:8001", "localhost", 8001},
  };
  for (const auto& [text, url, host, port] : ok) {
    const auto r = parse_upstream(Role::prefill, text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.error();
    EXPECT_EQ(r->url, url);
    EXPECT_EQ(r->host, host);
    EXPECT_EQ(r->port, port);
    EXPECT_EQ(r->role, Role::prefill);
    // TLS exactly when the URL says https://.
    EXPECT_EQ(r->tls, url.starts_with("https://")) << text;
  }
}

// The TLS options: both halves of a pair or neither, a client CA only with
// a listener certificate, and 1.2 or 1.3 as the oldest version.
TEST(ConfigTls, OptionsAndTheirRules) {
  auto ok = parse({"--decode", "d:1", "--prefill-servers-urls", "disable", "--tls-cert", "c.pem",
                   "--tls-key", "k.pem", "--tls-min-version", "1.3", "--upstream-ca", "ca.pem",
                   "--upstream-insecure", "true"});
  ASSERT_TRUE(ok.ok()) << ok.error();
  EXPECT_EQ(ok->config.tls_cert, "c.pem");
  EXPECT_EQ(ok->config.tls_key, "k.pem");
  EXPECT_EQ(ok->config.tls_min_version, 13u);
  EXPECT_EQ(ok->config.upstream_ca, "ca.pem");
  EXPECT_TRUE(ok->config.upstream_insecure);
  expect_error(parse({"--decode", "d:1", "--tls-cert", "c.pem"}), {"--tls-cert", "--tls-key"});
  expect_error(parse({"--decode", "d:1", "--tls-client-ca", "ca.pem"}), {"--tls-client-ca"});
  expect_error(parse({"--decode", "d:1", "--upstream-key", "k.pem"}), {"--upstream-cert"});
  expect_error(parse({"--decode", "d:1", "--tls-min-version", "1.1"}),
               {"--tls-min-version", "1.2 or 1.3"});
}

// Rejected forms give a reason: scheme, path, port, IPv6 brackets, junk.
TEST(ParseUpstream, RejectedForms) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"grpc://d:1", "http:// or https://"},
      {"http://d:1/v1", "paths"},
      {"http://d:1?x=1", "paths"},
      {"d", "missing port"},
      {"http://d", "missing port"},
      {"d:", "missing port"},
      {"d:0", "port"},
      {"d:65536", "port"},
      {"d:8x", "port"},
      {"::1:8100", "brackets"},
      {"[::1]", "missing port"},
      {"[::1:8100", "]"},
      {"[zz]:1", "IPv6"},
      {"user@d:1", "user info"},
      {"bad host:1", "host"},
      {"", "empty"},
  };
  for (const auto& [text, fragment] : bad) {
    const auto r = parse_upstream(Role::decode, text);
    ASSERT_FALSE(r.ok()) << "accepted: " << text;
    EXPECT_NE(r.error().find(fragment), std::string::npos) << text << ": " << r.error();
    EXPECT_NE(r.error().find("decode"), std::string::npos) << r.error();
  }
}

// to_string names every role.
TEST(ParseUpstream, RoleNames) {
  EXPECT_STREQ(to_string(Role::prefill), "prefill");
  EXPECT_STREQ(to_string(Role::decode), "decode");
  EXPECT_STREQ(to_string(Role::encode), "encode");
  EXPECT_STREQ(to_string(Role::both), "both");
}

// --- YAML --------------------------------------------------------------------------

// Every key can be set from YAML, with '-' or '_', lists and EPD URL lists.
TEST(ConfigYaml, AllKeys) {
  const auto r = apply_yaml(Config{}, R"(
host: 127.0.0.1
port: 9000
workers: 2
model: m
prefill: [p1:1, "http://p2:2"]
decode:
  - d1:3
encode_servers_urls: [http://e1:4, http://e2:5]
kv_connector: lmcache
max_body_size: 10MiB
max-header-size: 8K
header_timeout: 1s
client_idle_timeout: 30
connect_timeout: 250ms
first_byte_timeout: 10m
upstream_idle_timeout: 20s
upstream_max_idle: 8
log_level: trace
)");
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->host, "127.0.0.1");
  EXPECT_EQ(r->port, 9000);
  EXPECT_EQ(r->workers, 2u);
  EXPECT_EQ(r->model, "m");
  EXPECT_EQ(urls(r->prefill), (std::vector<std::string>{"http://p1:1", "http://p2:2"}));
  EXPECT_EQ(urls(r->decode), (std::vector<std::string>{"http://d1:3"}));
  EXPECT_EQ(urls(r->encode), (std::vector<std::string>{"http://e1:4", "http://e2:5"}));
  EXPECT_EQ(r->kv_connector, "lmcache");
  EXPECT_EQ(r->max_body_bytes, 10u << 20);
  EXPECT_EQ(r->max_header_bytes, 8u << 10);
  EXPECT_EQ(r->header_timeout, std::chrono::milliseconds(1000));
  EXPECT_EQ(r->client_idle_timeout, std::chrono::milliseconds(30'000));
  EXPECT_EQ(r->connect_timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(r->first_byte_timeout, std::chrono::milliseconds(600'000));
  EXPECT_EQ(r->upstream_idle_timeout, std::chrono::milliseconds(20'000));
  EXPECT_EQ(r->upstream_max_idle, 8u);
  EXPECT_EQ(r->log_level, "trace");
}

// The multi-turn keys work in YAML, with scalar or list values.
TEST(ConfigYaml, MultiTurnKeys) {
  const auto r = apply_yaml(Config{}, R"(
prefiller_hosts: [a, b]
prefiller_ports: [1, 2]
decoder-host: c
)");
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(urls(r->prefill), (std::vector<std::string>{"http://a:1", "http://b:2"}));
  EXPECT_EQ(urls(r->decode), (std::vector<std::string>{"http://c:8200"}));
}

// An empty document changes nothing; a key with no value keeps its default.
TEST(ConfigYaml, EmptyDocumentAndNullValue) {
  Config base;
  base.port = 1234;
  auto r = apply_yaml(base, "");
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->port, 1234);
  r = apply_yaml(base, "port:\n# comment only\n");
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->port, 1234);
}

// Flags override the file; file values not overridden stay.
TEST(ConfigYaml, FileThenFlagsOverride) {
  TempFile file("port: 9000\nlog-level: debug\ndecode: [d1:1]\nprefill: [p1:1]\n");
  const auto r = parse({"--config", file.path(), "--port", "9001", "--decode", "d2:2"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.port, 9001);
  EXPECT_EQ(r->config.log_level, "debug");
  EXPECT_EQ(urls(r->config.decode), (std::vector<std::string>{"http://d2:2"}));
  EXPECT_EQ(urls(r->config.prefill), (std::vector<std::string>{"http://p1:1"}));
  EXPECT_EQ(r->config.config_file, file.path());
}

// --config works in any position, with = too, since the file is always applied first.
TEST(ConfigYaml, ConfigFlagPosition) {
  TempFile file("port: 9000\ndecode: [d1:1]\nprefill: [p1:1]\n");
  const std::string eq = std::string("--config=") + file.path();
  const auto r = parse({"--port", "9001", eq.c_str()});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.port, 9001);
}

// YAML mistakes are errors naming the key or the position.
TEST(ConfigYaml, Errors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"prot: 1", "prot"},
      {"port: [1, 2]", "port"},
      {"port: {a: 1}", "port"},
      {"port: 70000", "port"},
      {"decode: [[a]]", "decode"},
      {"decode: []", "decode"},
      {"config: other.yaml", "config"},
      {"help: true", "help"},
      {"- a\n- b", "mapping"},
      {"port: [1", "line"},
      {"max_body_size: lots", "max_body_size"},
  };
  for (const auto& [text, fragment] : cases) {
    const auto r = apply_yaml(Config{}, text);
    ASSERT_FALSE(r.ok()) << "accepted: " << text;
    EXPECT_NE(r.error().find(fragment), std::string::npos) << text << ": " << r.error();
  }
}

// A missing config file is an error naming the path; a bad one names the file.
TEST(ConfigYaml, FileErrors) {
  expect_error(parse({"--config", "/nonexistent/pdgate.yaml"}),
               {"--config", "/nonexistent/pdgate.yaml"});
  TempFile bad("port: nope\n");
  expect_error(parse({"--config", bad.path()}), {bad.path(), "port"});
}

// The shipped example config parses and validates.
TEST(ConfigYaml, ExampleFileIsValid) {
  const char* src = std::getenv("PDGATE_SOURCE_DIR");
  const std::string dir = src != nullptr ? src : PDGATE_TEST_SOURCE_DIR;
  const std::string path = dir + "/config/pdgate.example.yaml";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const auto r = parse({"--config", path.c_str()});
  ASSERT_TRUE(r.ok()) << r.error();
  // Its labelled decode entry keeps labels and weight.
  ASSERT_FALSE(r->config.decode.empty());
  EXPECT_EQ(r->config.decode[0].labels.at("tier"), "gold");
  EXPECT_EQ(r->config.decode[0].weight, 2u);
}

// --shared-kv-index is on by default, takes on|off, and refuses anything else by name.
TEST(ConfigRedis, SharedKvIndexSwitch) {
  auto r = parse({"--decode", "d:1", "--kv-connector", "none"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_TRUE(r->config.shared_kv_index);
  r = parse({"--decode", "d:1", "--kv-connector", "none", "--shared-kv-index", "off"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_FALSE(r->config.shared_kv_index);
  expect_error(parse({"--decode", "d:1", "--shared-kv-index", "maybe"}), {"shared-kv-index"});
}

// --- Policies --------------------------------------------------------------------------

// Without policy flags every stage runs round_robin with the documented limits.
TEST(ConfigPolicies, Defaults) {
  const auto r = parse({"--decode", "d:1", "--kv-connector", "none"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Config& c = r->config;
  EXPECT_EQ(c.policy, "round_robin");
  EXPECT_TRUE(c.policy_prefill.empty() && c.policy_decode.empty() && c.policy_encode.empty());
  EXPECT_TRUE(c.policy_dir.empty());
  EXPECT_EQ(c.policy_budget, std::chrono::microseconds(1000));
  EXPECT_EQ(c.policy_memory, 64u << 20);
  EXPECT_EQ(c.prefix_block_size, 256u);
  EXPECT_EQ(c.policy_poll_interval, std::chrono::milliseconds(1000));
  EXPECT_EQ(c.metrics_interval, std::chrono::milliseconds(250));
}

// Every policy flag parses into its field.
TEST(ConfigPolicies, Flags) {
  const auto r = parse({"--decode",
                        "d:1",
                        "--kv-connector",
                        "none",
                        "--policy",
                        "least_load",
                        "--policy-prefill",
                        "prefix_affinity",
                        "--policy-decode",
                        "/x/mine.lua",
                        "--policy-encode",
                        "power_of_two",
                        "--policy-dir",
                        "/etc/pdgate/policies",
                        "--policy-budget-us",
                        "250",
                        "--policy-memory",
                        "8MiB",
                        "--prefix-block-size",
                        "1K",
                        "--policy-poll-interval",
                        "250ms",
                        "--metrics-interval",
                        "2s"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Config& c = r->config;
  EXPECT_EQ(c.policy, "least_load");
  EXPECT_EQ(c.policy_prefill, "prefix_affinity");
  EXPECT_EQ(c.policy_decode, "/x/mine.lua");
  EXPECT_EQ(c.policy_encode, "power_of_two");
  EXPECT_EQ(c.policy_dir, "/etc/pdgate/policies");
  EXPECT_EQ(c.policy_budget, std::chrono::microseconds(250));
  EXPECT_EQ(c.policy_memory, 8u << 20);
  EXPECT_EQ(c.prefix_block_size, 1024u);
  EXPECT_EQ(c.policy_poll_interval, std::chrono::milliseconds(250));
  EXPECT_EQ(c.metrics_interval, std::chrono::milliseconds(2000));
}

// --metrics-interval off (or 0) turns scraping off.
TEST(ConfigPolicies, MetricsOff) {
  for (const char* v : {"off", "0", "OFF"}) {
    const auto r = parse({"--decode", "d:1", "--kv-connector", "none", "--metrics-interval", v});
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(r->config.metrics_interval.count(), 0) << v;
  }
}

// Policy keys work in YAML, under their names without dashes.
TEST(ConfigPolicies, Yaml) {
  auto c = apply_yaml(Config{},
                      "policy: session_affinity\npolicy_decode: conversation_decode\n"
                      "policy_budget_us: 500\nprefix_block_size: 512\n");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->policy, "session_affinity");
  EXPECT_EQ(c->policy_decode, "conversation_decode");
  EXPECT_EQ(c->policy_budget, std::chrono::microseconds(500));
  EXPECT_EQ(c->prefix_block_size, 512u);
}

// Bad values are rejected with the flag's name.
TEST(ConfigPolicies, Errors) {
  expect_error(parse({"--decode", "d:1", "--kv-connector", "none", "--policy-budget-us", "0"}),
               {"--policy-budget-us", "at least 1"});
  expect_error(parse({"--decode", "d:1", "--kv-connector", "none", "--policy-budget-us", "x"}),
               {"--policy-budget-us"});
  expect_error(parse({"--decode", "d:1", "--kv-connector", "none", "--policy", ""}),
               {"--policy", "empty"});
  expect_error(parse({"--decode", "d:1", "--kv-connector", "none", "--policy-memory", "100K"}),
               {"--policy-memory", "1MiB"});
  expect_error(parse({"--decode", "d:1", "--kv-connector", "none", "--prefix-block-size", "8"}),
               {"--prefix-block-size", "16"});
  expect_error(parse({"--decode", "d:1", "--kv-connector", "none", "--metrics-interval", "soon"}),
               {"--metrics-interval"});
}

// --- Help ------------------------------------------------------------------------------

// The help text has a usage line and mentions every flag, alias and short form.
TEST(ConfigHelp, MentionsEveryFlag) {
  const std::string h = help_text();
  EXPECT_EQ(h.rfind("usage: pdgate", 0), 0u);
  for (const char* flag : {"--host",
                           "--port",
                           "--workers",
                           "--config",
                           "--log-level",
                           "--help",
                           "-h",
                           "--model",
                           "-m",
                           "--prefill",
                           "-p",
                           "--decode",
                           "-d",
                           "--prefiller-host",
                           "--prefiller-hosts",
                           "--prefiller-port",
                           "--prefiller-ports",
                           "--decoder-host",
                           "--decoder-hosts",
                           "--decoder-port",
                           "--decoder-ports",
                           "--encode-servers-urls",
                           "--prefill-servers-urls",
                           "--decode-servers-urls",
                           "--max-body-size",
                           "--max-header-size",
                           "--header-timeout",
                           "--client-idle-timeout",
                           "--connect-timeout",
                           "--first-byte-timeout",
                           "--upstream-idle-timeout",
                           "--upstream-max-idle",
                           "--kv-connector",
                           "--policy",
                           "--policy-prefill",
                           "--policy-decode",
                           "--policy-encode",
                           "--policy-dir",
                           "--policy-budget-us",
                           "--policy-memory",
                           "--prefix-block-size",
                           "--policy-poll-interval",
                           "--metrics-interval"}) {
    EXPECT_NE(h.find(flag), std::string::npos) << flag;
  }
  for (const char* group :
       {"Listener:", "Engines:", "Client limits:", "Upstream:", "Policies:", "General:"}) {
    EXPECT_NE(h.find(group), std::string::npos) << group;
  }
}

// Admin and health flags parse into the config; bad values name the flag.
TEST(ConfigAdmin, AdminAndHealthFlags) {
  const auto r = parse({"-d",
                        "b:2",
                        "-p",
                        "a:1",
                        "--admin-port",
                        "9000",
                        "--admin-host",
                        "0.0.0.0",
                        "--allowed-upstreams",
                        "10.0.0.0/8",
                        "192.168.0.0/16",
                        "--health-interval",
                        "off",
                        "--health-rise",
                        "3",
                        "--health-fall",
                        "4",
                        "--eject-after",
                        "5",
                        "--retry-budget",
                        "0.5"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Config& c = r->config;
  EXPECT_TRUE(c.admin_enabled);
  EXPECT_EQ(c.admin_port, 9000);
  EXPECT_EQ(c.admin_host, "0.0.0.0");
  EXPECT_EQ(c.allowed_upstreams, (std::vector<std::string>{"10.0.0.0/8", "192.168.0.0/16"}));
  EXPECT_EQ(c.health_interval.count(), 0);
  EXPECT_EQ(c.health_rise, 3u);
  EXPECT_EQ(c.health_fall, 4u);
  EXPECT_EQ(c.eject_after, 5u);
  EXPECT_DOUBLE_EQ(c.retry_budget, 0.5);
  EXPECT_FALSE(parse({"-d", "b:2", "-p", "a:1"})->config.admin_enabled);
  expect_error(parse({"-d", "b:2", "-p", "a:1", "--admin-port", "70000"}), {"admin-port"});
  expect_error(parse({"-d", "b:2", "-p", "a:1", "--eject-after", "0"}), {"eject-after"});
  expect_error(parse({"-d", "b:2", "-p", "a:1", "--retry-budget", "2"}), {"retry-budget"});
}

// --health-max-concurrency defaults to 64, takes 1 to 1000, is in the help, and a bad value
// names the flag.
TEST(ConfigAdmin, HealthMaxConcurrency) {
  EXPECT_EQ(parse({"-d", "b:2", "-p", "a:1"})->config.health_max_concurrency, 64u);
  const auto r = parse({"-d", "b:2", "-p", "a:1", "--health-max-concurrency", "8"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.health_max_concurrency, 8u);
  expect_error(parse({"-d", "b:2", "-p", "a:1", "--health-max-concurrency", "0"}),
               {"health-max-concurrency"});
  expect_error(parse({"-d", "b:2", "-p", "a:1", "--health-max-concurrency", "1001"}),
               {"health-max-concurrency"});
  EXPECT_NE(help_text().find("--health-max-concurrency"), std::string::npos);
}

// The SIGTERM drain deadline and the admin add's model check bound.
TEST(ConfigAdmin, ShutdownAndModelCheckTimeouts) {
  const auto defaults = parse({"-d", "b:2", "-p", "a:1"});
  ASSERT_TRUE(defaults.ok()) << defaults.error();
  EXPECT_EQ(defaults->config.shutdown_timeout, std::chrono::seconds(30));
  EXPECT_EQ(defaults->config.model_check_timeout, std::chrono::seconds(5));
  const auto r = parse(
      {"-d", "b:2", "-p", "a:1", "--shutdown-timeout", "2m", "--model-check-timeout", "750ms"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.shutdown_timeout, std::chrono::minutes(2));
  EXPECT_EQ(r->config.model_check_timeout, std::chrono::milliseconds(750));
  expect_error(parse({"-d", "b:2", "-p", "a:1", "--shutdown-timeout", "0"}), {"shutdown-timeout"});
  expect_error(parse({"-d", "b:2", "-p", "a:1", "--shutdown-timeout", "25h"}),
               {"shutdown-timeout"});
  expect_error(parse({"-d", "b:2", "-p", "a:1", "--model-check-timeout", "10m"}),
               {"model-check-timeout"});
  expect_error(parse({"-d", "b:2", "-p", "a:1", "--model-check-timeout", "soon"}),
               {"model-check-timeout"});
}

}  // namespace
}  // namespace pdgate

namespace pdgate {
namespace {

// "url@zmqhost:zmqport" keeps the engine address and records the ZMQ peer.
TEST(ParseUpstream, KvPeerAfterAt) {
  auto u = parse_upstream(Role::prefill, "http://10.0.0.1:8100@10.0.0.1:21001");
  ASSERT_TRUE(u) << u.error();
  EXPECT_EQ(u->url, "http://10.0.0.1:8100");
  EXPECT_EQ(u->kv_peer, "10.0.0.1:21001");
  EXPECT_FALSE(parse_upstream(Role::prefill, "http://10.0.0.1:8100@nohost"));
}

// An IPv6 kv peer keeps its brackets, as ZMQ's tcp://[addr]:port needs.
TEST(ParseUpstream, Ipv6KvPeerInBrackets) {
  auto u = parse_upstream(Role::prefill, "http://[::1]:8100@[fd00::2]:21001");
  ASSERT_TRUE(u) << u.error();
  EXPECT_EQ(u->url, "http://[::1]:8100");
  EXPECT_EQ(u->kv_peer, "[fd00::2]:21001");
}

// Garbage in any URL option is refused with the option's name and the
// part at fault: spaces, ports past 65535, an empty host.
TEST(ConfigErrors, UrlGarbageNamesTheOption) {
  expect_error(parse({"--decode", "bad host:1"}), {"--decode", "a space in the host"});
  expect_error(parse({"--prefill", "p:70000", "--decode", "d:1"}),
               {"--prefill", "invalid port '70000'"});
  expect_error(parse({"--decode-servers-urls", "http://d:1,http://[::1:2"}),
               {"--decode-servers-urls", "missing ']'"});
  expect_error(parse({"--prefill", "p:1", "--decode", "d:1", "--otlp-endpoint", "http://:4318"}),
               {"--otlp-endpoint", "missing host"});
  expect_error(
      parse({"--prefill", "p:1", "--decode", "d:1", "--otlp-endpoint", "http://c:99999/v1/traces"}),
      {"--otlp-endpoint", "invalid port '99999'"});
  expect_error(parse({"--prefill", "p:1", "--decode", "d:1", "--otlp-endpoint", "http://c a:1"}),
               {"--otlp-endpoint", "a space in the host"});
  // IPv6 works in every form, the multi-turn one included.
  const auto r = parse({"--prefiller-host", "::1", "--prefiller-port", "8100", "--decoder-host",
                        "[fd00::1]", "--decoder-port", "8200"});
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(urls(r->config.prefill), std::vector<std::string>{"http://[::1]:8100"});
  EXPECT_EQ(urls(r->config.decode), std::vector<std::string>{"http://[fd00::1]:8200"});
}

// --- Every error at once (--check-config) ---------------------------------------

// A command line and a file with several mistakes: every one is reported,
// a line each, each naming its flag or key.
TEST(ConfigErrors, EveryMistakeReported) {
  TempFile file(
      "decode: [localhost:8200]\n"
      "connect-timeout: soon\n"
      "prot: 1\n"
      "max_body_size: lots\n"
      "prefill: [localhost:8100, nohost]\n");
  const auto r = parse({"--config", file.path(), "--port", "70000", "--bogus", "x",
                        "--retry-budget", "2", "--policy-budget-us"});
  ASSERT_FALSE(r.ok());
  expect_error(r, {"connect-timeout", "'prot'", "max_body_size", "prefill", "nohost", "--port",
                   "70000", "--bogus", "--retry-budget", "--policy-budget-us"});
  // One line per mistake, and the bogus flag's value is not a second one.
  const auto lines = std::count(r.error().begin(), r.error().end(), '\n') + 1;
  EXPECT_EQ(lines, 8) << r.error();
  EXPECT_EQ(r.error().find("unexpected argument 'x'"), std::string::npos) << r.error();
}

// Cross-field rules are reported next to bad values: a bad duration and a
// missing decode list, both named.
TEST(ConfigErrors, RulesAndValuesTogether) {
  TempFile file("prefill: [localhost:8100]\nfirst-byte-timeout: never\nlog-level: loud\n");
  expect_error(parse({"--config", file.path()}),
               {"first-byte-timeout", "never", "log-level", "no decode instances"});
}

// The same instance twice in a role's list is refused, naming it; the
// same address in two roles is not a duplicate.
TEST(ConfigErrors, DuplicateInstancesAsWritten) {
  expect_error(parse({"--prefill", "localhost:8100", "--decode", "localhost:8200",
                      "http://LOCALHOST:8200/"}),
               {"decode instance", "listed twice", "localhost:8200"});
  TempFile file("prefill: [localhost:8100]\ndecode-servers-urls: [h:1, 'http://h:1']\n");
  expect_error(parse({"--config", file.path()}), {"listed twice", "http://h:1"});
  EXPECT_TRUE(parse({"--prefill", "h:1", "--decode", "h:1"}).ok());
}

// --- Labels and weights in YAML instance lists ----------------------------------

// An instance given as {url, labels, weight} carries them; plain strings in
// the same list keep working with no labels and weight 1.
TEST(ConfigYaml, InstanceLabelsAndWeight) {
  const auto r = apply_yaml(Config{},
                            "decode:\n"
                            "  - url: http://d1:8200\n"
                            "    labels: {tier: gold, zone: a}\n"
                            "    weight: 2\n"
                            "  - localhost:8201\n"
                            "prefill-servers-urls:\n"
                            "  - {url: 'http://p1:8100', labels: {tier: silver}}\n"
                            "  - http://p2:8100\n");
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_EQ(r->decode.size(), 2u);
  EXPECT_EQ(r->decode[0].url, "http://d1:8200");
  EXPECT_EQ(r->decode[0].labels,
            (std::map<std::string, std::string>{{"tier", "gold"}, {"zone", "a"}}));
  EXPECT_EQ(r->decode[0].weight, 2u);
  EXPECT_TRUE(r->decode[1].labels.empty());
  EXPECT_EQ(r->decode[1].weight, 1u);
  ASSERT_EQ(r->prefill.size(), 2u);
  EXPECT_EQ(r->prefill[0].labels.at("tier"), "silver");
  EXPECT_EQ(r->prefill[1].url, "http://p2:8100");
}

// Labels past LabelLimits are refused wherever they come from: the one
// check (label_problem) names the bound, and a YAML instance list past it
// is a configuration error naming the instance.
TEST(ConfigYaml, LabelBounds) {
  using L = LabelLimits;
  std::map<std::string, std::string> ok;
  for (std::size_t i = 0; i < L::kMaxCount; ++i)
    ok["k" + std::to_string(i)] = "v";
  EXPECT_FALSE(label_problem(ok));
  EXPECT_FALSE(
      label_problem({{std::string(L::kMaxKeyBytes, 'k'), std::string(L::kMaxValueBytes, 'v')}}));
  auto many = ok;
  many["one-more"] = "v";
  EXPECT_NE(label_problem(many).value_or("").find("at most 64 labels"), std::string::npos);
  EXPECT_NE(label_problem({{std::string(L::kMaxKeyBytes + 1, 'k'), "v"}}).value_or("").find("128"),
            std::string::npos);
  EXPECT_NE(
      label_problem({{"k", std::string(L::kMaxValueBytes + 1, 'v')}}).value_or("").find("1024"),
      std::string::npos);
  EXPECT_TRUE(label_problem({{"", "v"}}));
  std::map<std::string, std::string> heavy;
  for (int i = 0; i < 9; ++i)
    heavy["k" + std::to_string(i)] = std::string(1000, 'v');
  EXPECT_NE(label_problem(heavy).value_or("").find("8192 bytes"), std::string::npos);

  const auto r = apply_yaml(Config{}, "decode:\n  - url: http://d1:8200\n    labels: {big: " +
                                          std::string(2000, 'x') + "}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("http://d1:8200: labels: label 'big' has a value longer than 1024"),
            std::string::npos)
      << r.error();
}

// Malformed instance entries are refused with a message naming the key and
// the fault; all of them are reported together.
TEST(ConfigYaml, InstanceEntryErrors) {
  const auto r = apply_yaml(Config{},
                            "decode:\n"
                            "  - {labels: {a: b}}\n"
                            "  - {url: 'd:1', weight: 0}\n"
                            "  - {url: 'd:2', labels: [a]}\n"
                            "  - {url: 'd:3', color: red}\n"
                            "  - {url: 'd:4', weight: 1001}\n"
                            "port: [1]\n");
  ASSERT_FALSE(r.ok());
  for (const char* f : {"needs a url", "weight must be an integer from 1 to 1000",
                        "labels must be a mapping", "unknown instance field 'color'", "'port'"}) {
    EXPECT_NE(r.error().find(f), std::string::npos) << f << " not in: " << r.error();
  }
  EXPECT_NE(r.error().find("key 'decode'"), std::string::npos) << r.error();
  // Labels only belong to instance lists.
  EXPECT_FALSE(apply_yaml(Config{}, "allowed-upstreams: [{url: x}]\n").ok());
}

// --- The effective configuration and reloads -------------------------------------

// Every option --help lists (but those only the command line takes)
// appears in the effective configuration, with a value.
TEST(ConfigEffective, EveryHelpOptionShown) {
  std::set<std::string> shown;
  for (const auto& e : effective_config(Config{})) {
    shown.insert(e.key);
    // An empty list is a value (no instances); a single value is never missing.
    if (!e.list) {
      ASSERT_EQ(e.values.size(), 1u) << e.key;
    }
    for (const auto& v : e.values)
      EXPECT_NE(v, "(not shown)") << e.key;
  }
  std::istringstream help(help_text());
  std::string line;
  std::size_t options = 0;
  while (std::getline(help, line)) {
    if (!line.starts_with("  --"))
      continue;
    const std::string key = line.substr(4, line.find_first_of(" ,", 4) - 4);
    if (key == "config" || key == "help" || key == "version" || key == "check-config")
      continue;
    ++options;
    EXPECT_TRUE(shown.count(key)) << key << " missing from effective_config";
  }
  EXPECT_EQ(shown.size(), options);
  EXPECT_GE(options, 55u);
}

// Values are shown in the syntax their flags take, and secrets are masked:
// a Redis password never appears.
TEST(ConfigEffective, ValuesAndMasking) {
  const auto r = parse({"--prefill", "p:1", "--decode", "d:2", "--first-byte-timeout", "1500ms",
                        "--max-body-size", "2MiB", "--redis", "redis://:hunter2@r:6379/0",
                        "--health-interval", "off", "--retry-budget", "0.25"});
  ASSERT_TRUE(r.ok()) << r.error();
  std::map<std::string, std::vector<std::string>> v;
  for (const auto& e : effective_config(r->config))
    v[e.key] = e.values;
  EXPECT_EQ(v["first-byte-timeout"], std::vector<std::string>{"1500ms"});
  EXPECT_EQ(v["connect-timeout"], std::vector<std::string>{"5s"});
  EXPECT_EQ(v["max-body-size"], std::vector<std::string>{"2MiB"});
  EXPECT_EQ(v["health-interval"], std::vector<std::string>{"off"});
  EXPECT_EQ(v["retry-budget"], std::vector<std::string>{"0.25"});
  EXPECT_EQ(v["redis"], std::vector<std::string>{"redis://:***@r:6379/0"});
  EXPECT_EQ(v["decode"], std::vector<std::string>{"http://d:2"});
  EXPECT_EQ(mask_url_password("redis://user:pw@h:1"), "redis://user:***@h:1");
  EXPECT_EQ(mask_url_password("redis://h:1"), "redis://h:1");
  EXPECT_EQ(mask_url_password("unix:///run/redis.sock"), "unix:///run/redis.sock");
}

// Passwords given as query items (unix:// sockets, sentinels) are masked
// too in the effective configuration, as the user info's password is.
TEST(EffectiveConfig, MasksQueryPasswords) {
  const auto r = parse({"--decode", "d:2", "--prefill-servers-urls", "disable", "--redis",
                        "unix:///run/redis.sock?db=1&password=unixpw"});
  ASSERT_TRUE(r.ok()) << r.error();
  for (const auto& e : effective_config(r->config)) {
    if (e.key == "redis") {
      EXPECT_EQ(e.values, std::vector<std::string>{"unix:///run/redis.sock?db=1&password=***"});
    }
  }
  EXPECT_EQ(mask_url_password("redis+sentinel://:pw@s1,s2/m?sentinel_password=spw"),
            "redis+sentinel://:***@s1,s2/m?sentinel_password=***");
  EXPECT_EQ(mask_url_password("redis://pw@h:1"), "redis://***@h:1");
}

// A reload's diff names what changes at run time and what needs a
// restart, and reports an instance list once under its own key.
TEST(ConfigReload, DiffNamesAppliedAndRestartKeys) {
  const auto a = parse({"--prefill", "p:1", "--decode", "d:1", "d:2"});
  const auto b = parse({"--prefill", "p:1", "--decode", "d:1", "d:3", "--first-byte-timeout", "2s",
                        "--port", "9000", "--workers", "3", "--retry-budget", "0.5"});
  ASSERT_TRUE(a.ok() && b.ok());
  const auto d = diff_config(a->config, b->config);
  EXPECT_EQ(d.applied, (std::vector<std::string>{"decode", "first-byte-timeout", "retry-budget"}));
  EXPECT_EQ(d.restart_needed, (std::vector<std::string>{"port", "workers"}));
  EXPECT_TRUE(diff_config(a->config, a->config).applied.empty());

  // Prefill switched back on: a restart; its list is not applied before.
  const auto off = parse({"--decode", "d:1", "d:2", "--prefill-servers-urls", "disable"});
  ASSERT_TRUE(off.ok()) << off.error();
  const auto on = diff_config(off->config, a->config);
  EXPECT_TRUE(on.applied.empty()) << on.applied.front();
  EXPECT_EQ(on.restart_needed, std::vector<std::string>{"prefill-servers-urls (disable)"});
  // And switched off: the running prefill list stays until the restart.
  const auto to_off = diff_config(a->config, off->config);
  EXPECT_TRUE(to_off.applied.empty()) << to_off.applied.front();
  EXPECT_EQ(urls(reloadable_part(a->config, off->config).prefill),
            std::vector<std::string>{"http://p:1"});
}

// Values tried in turn for each option below, until one is accepted and
// changes what the option shows. The test finds each option's new value
// itself, so an option added to the table is covered without a line here;
// one that no value changes fails the test, which names it. (None of them
// switches prefill off: that waits for a restart whichever option says it,
// see DiffNamesAppliedAndRestartKeys.)
constexpr const char* kReloadValues[] = {"7",
                                         "false",
                                         "true",
                                         "0.5",
                                         "1.3",
                                         "closed",
                                         "error",
                                         "json",
                                         "sim",
                                         "d:9",
                                         "lmcache",
                                         "push",
                                         "sequential",
                                         "http://collector:4318",
                                         "http://d:1=tcp://e:5557",
                                         "http://d:1=2",
                                         "mine=debug"};

// Every restart-only option has a binding that keeps its running value
// through a reload, and every option a config file may set can be shown
// in the effective config. (A runtime check: GCC does not take the
// addresses' comparison as a constant expression under -fsanitize.)
TEST(ConfigOptions, EveryOptionCanBeKeptAndShown) {
  std::size_t checked = 0;
  for (const auto& o : config_detail::options()) {
    EXPECT_TRUE(!o.restart || o.binding.keep != nullptr) << o.key << " has no keep";
    EXPECT_TRUE(o.cli_only || o.binding.show != nullptr) << o.key << " has no show";
    ++checked;
  }
  EXPECT_GT(checked, 80u);
}

// What a reload applies, for every option the effective config shows,
// changed alone: a restart-only option keeps its running value, and every
// other option, the changed one included, takes the new file's. So each
// restart-only option's binding copies its own value and no other.
TEST(ConfigReload, ReloadablePartKeepsExactlyTheRestartOnlyOptions) {
  const auto a = parse({"--prefill", "p:1", "--decode", "d:1"});
  ASSERT_TRUE(a.ok()) << a.error();
  const auto shown = [](const Config& c) {
    std::map<std::string, std::vector<std::string>> out;
    for (const auto& e : effective_config(c))
      out[e.key] = e.values;
    return out;
  };
  const auto running = shown(a->config);
  std::size_t kept = 0, applied = 0;
  for (const auto& option : effective_config(a->config)) {
    const std::string& key = option.key;
    std::optional<Config> changed;
    for (const char* value : kReloadValues) {
      auto c = apply_yaml(a->config, key + ": \"" + value + "\"\n");
      if (c && shown(*c).at(key) != running.at(key)) {
        changed = std::move(*c);
        break;
      }
    }
    ASSERT_TRUE(changed.has_value()) << "no value in kReloadValues changes " << key;
    const auto wanted = shown(*changed);
    for (const auto& e : effective_config(reloadable_part(a->config, *changed))) {
      if (e.restart) {
        EXPECT_EQ(e.values, running.at(e.key))
            << e.key << " is restart-only, yet a reload changing " << key << " changed it";
      } else {
        EXPECT_EQ(e.values, wanted.at(e.key))
            << e.key << " changes at run time, yet a reload changing " << key << " kept it";
      }
    }
    if (option.restart) {
      const auto d = diff_config(a->config, *changed);
      EXPECT_NE(std::find(d.restart_needed.begin(), d.restart_needed.end(), key),
                d.restart_needed.end())
          << key;
    }
    ++(option.restart ? kept : applied);
  }
  EXPECT_GE(kept, 40u);
  EXPECT_GE(applied, 30u);
}

}  // namespace
}  // namespace pdgate

namespace pdgate {
namespace {

// The access log options: off by default, a path or stderr and a format
// from the command line or YAML; any other format is refused by name.
TEST(ConfigAccessLog, FlagsYamlAndRefusals) {
  auto d = parse({"--decode", "d:1", "--prefill-servers-urls", "disable"});
  ASSERT_TRUE(d) << d.error();
  EXPECT_EQ(d->config.access_log, "off");
  EXPECT_EQ(d->config.access_log_format, "text");
  auto f = parse({"--decode", "d:1", "--prefill-servers-urls", "disable", "--access-log",
                  "/var/log/pdgate/access.log", "--access-log-format", "json"});
  ASSERT_TRUE(f) << f.error();
  EXPECT_EQ(f->config.access_log, "/var/log/pdgate/access.log");
  EXPECT_EQ(f->config.access_log_format, "json");
  auto y = apply_yaml(Config{}, "access_log: stderr\naccess-log-format: json\n");
  ASSERT_TRUE(y) << y.error();
  EXPECT_EQ(y->access_log, "stderr");
  EXPECT_EQ(y->access_log_format, "json");
  auto bad = parse({"--decode", "d:1", "--access-log-format", "yaml"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("--access-log-format"), std::string::npos) << bad.error();
  EXPECT_FALSE(parse({"--decode", "d:1", "--access-log", " "}));
}

}  // namespace
}  // namespace pdgate

namespace pdgate {
namespace {

// Tracing options: endpoint, ratio and batching are read; defaults are off.
TEST(TracingOptions, ParsedAndDefaulted) {
  auto off = parse({"--prefill", "p:1", "--decode", "d:1"});
  ASSERT_TRUE(off) << off.error();
  EXPECT_TRUE(off->config.otlp_endpoint.empty());
  EXPECT_EQ(off->config.trace_sample_ratio, 1.0);
  auto r =
      parse({"--prefill", "p:1", "--decode", "d:1", "--otlp-endpoint", "http://collector:4318",
             "--trace-sample-ratio", "0.25", "--otlp-batch-size", "64", "--otlp-export-interval",
             "200ms", "--otlp-queue-size", "1000", "--otlp-timeout", "2s"});
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(r->config.otlp_endpoint, "http://collector:4318");
  EXPECT_EQ(r->config.trace_sample_ratio, 0.25);
  EXPECT_EQ(r->config.otlp_batch_size, 64u);
  EXPECT_EQ(r->config.otlp_export_interval, std::chrono::milliseconds(200));
  EXPECT_EQ(r->config.otlp_queue_size, 1000u);
  EXPECT_EQ(r->config.otlp_timeout, std::chrono::seconds(2));
  expect_error(parse({"--prefill", "p:1", "--decode", "d:1", "--trace-sample-ratio", "1.5"}),
               {"--trace-sample-ratio", "fraction"});
  expect_error(
      parse({"--prefill", "p:1", "--decode", "d:1", "--otlp-endpoint", "grpc://collector:4317"}),
      {"--otlp-endpoint", "only http:// and https://"});
  expect_error(parse({"--prefill", "p:1", "--decode", "d:1", "--otlp-endpoint", "collector:4318"}),
               {"--otlp-endpoint", "http://"});
}

// The OTLP URL: port 80 and /v1/traces unless given; IPv6 in brackets.
TEST(TracingOptions, HttpEndpoint) {
  auto e = parse_http_endpoint("http://collector", "/v1/traces");
  ASSERT_TRUE(e) << e.error();
  EXPECT_EQ(e->host, "collector");
  EXPECT_EQ(e->port, 80);
  EXPECT_EQ(e->target, "/v1/traces");
  e = parse_http_endpoint("http://[::1]:4318/otlp/v1/traces", "/v1/traces");
  ASSERT_TRUE(e) << e.error();
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->port, 4318);
  EXPECT_EQ(e->target, "/otlp/v1/traces");
  EXPECT_FALSE(e->tls);
  // https://: TLS, port 443 unless given.
  e = parse_http_endpoint("https://collector.example", "/v1/traces");
  ASSERT_TRUE(e) << e.error();
  EXPECT_TRUE(e->tls);
  EXPECT_EQ(e->port, 443);
  EXPECT_FALSE(parse_http_endpoint("http://c:4318/v1/traces?x=1", "/"));
  EXPECT_FALSE(parse_http_endpoint("http:///v1/traces", "/"));
}

// --forward-headers and --set-header (repeatable, and a YAML list): names
// lower-cased, values trimmed.
TEST(ForwardedHeaderOptions, Parsed) {
  auto r =
      parse({"--prefill", "p:1", "--decode", "d:1", "--forward-headers", "X-Tenant-Id, x-priority",
             "--set-header", "X-Cluster: eu-1", "--set-header", "x-team:  infra "});
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(r->config.forward_headers, (std::vector<std::string>{"x-tenant-id", "x-priority"}));
  ASSERT_EQ(r->config.set_headers.size(), 2u);
  EXPECT_EQ(r->config.set_headers[0], (std::pair<std::string, std::string>{"x-cluster", "eu-1"}));
  EXPECT_EQ(r->config.set_headers[1], (std::pair<std::string, std::string>{"x-team", "infra"}));
  auto y = apply_yaml(Config{}, "set_header:\n  - 'X-A: 1'\n  - 'X-B: 2'\nforward_headers: x-c\n");
  ASSERT_TRUE(y) << y.error();
  EXPECT_EQ(y->set_headers.size(), 2u);
  EXPECT_EQ(y->forward_headers, std::vector<std::string>{"x-c"});
}

// Hop-by-hop, framing and pdgate's own headers, bad names and CR/LF in a
// value are refused at config time, naming the header.
TEST(ForwardedHeaderOptions, ForbiddenRefused) {
  expect_error(
      parse({"--prefill", "p:1", "--decode", "d:1", "--forward-headers", "x-a,Connection"}),
      {"--forward-headers", "connection", "hop-by-hop"});
  expect_error(
      parse({"--prefill", "p:1", "--decode", "d:1", "--forward-headers", "transfer-encoding"}),
      {"hop-by-hop"});
  expect_error(parse({"--prefill", "p:1", "--decode", "d:1", "--set-header", "Content-Length: 5"}),
               {"--set-header", "content-length"});
  expect_error(parse({"--prefill", "p:1", "--decode", "d:1", "--set-header", "Host: x"}), {"host"});
  expect_error(parse({"--prefill", "p:1", "--decode", "d:1", "--set-header", "traceparent: x"}),
               {"traceparent"});
  expect_error(
      parse({"--prefill", "p:1", "--decode", "d:1", "--set-header", "X-Forwarded-For: 1.2.3.4"}),
      {"x-forwarded-for"});
  expect_error(
      parse({"--prefill", "p:1", "--decode", "d:1", "--set-header", "x-a: b\r\nx-evil: 1"}),
      {"control character"});
  expect_error(parse({"--prefill", "p:1", "--decode", "d:1", "--set-header", "no colon"}),
               {"Name: value"});
  expect_error(parse({"--prefill", "p:1", "--decode", "d:1", "--set-header", "bad name: v"}),
               {"not a header name"});
  expect_error(parse({"--prefill", "p:1", "--decode", "d:1", "--set-header", "x-empty:"}),
               {"empty"});
  auto y = apply_yaml(Config{}, "forward_headers: [upgrade]\n");
  ASSERT_FALSE(y);
  EXPECT_NE(y.error().find("hop-by-hop"), std::string::npos) << y.error();
}

}  // namespace
}  // namespace pdgate

namespace pdgate {
namespace {

// --kv-events attaches an event endpoint (and replay endpoint) to the instance it names, in
// whichever list that instance is; instances not named get none.
TEST(ConfigKvEvents, FlagAttachesToNamedInstance) {
  auto r =
      parse({"--prefill", "127.0.0.1:8100", "127.0.0.1:8101", "--decode", "127.0.0.1:8200",
             "--kv-events", "127.0.0.1:8100=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558",
             "--kv-events", "http://127.0.0.1:8200=tcp://127.0.0.1:6557", "--tokenizer", "sim"});
  ASSERT_TRUE(r.ok()) << r.error();
  const Config& c = r->config;
  EXPECT_EQ(c.prefill[0].kv_events.endpoint, "tcp://127.0.0.1:5557");
  EXPECT_EQ(c.prefill[0].kv_events.replay, "tcp://127.0.0.1:5558");
  EXPECT_TRUE(c.prefill[1].kv_events.endpoint.empty());
  EXPECT_EQ(c.decode[0].kv_events.endpoint, "tcp://127.0.0.1:6557");
  EXPECT_TRUE(c.decode[0].kv_events.replay.empty());
  EXPECT_EQ(c.tokenizer, "sim");
  const auto rows = effective_config(c);
  const auto row = std::find_if(rows.begin(), rows.end(),
                                [](const ConfigEntry& e) { return e.key == "kv-events"; });
  ASSERT_NE(row, rows.end());
  EXPECT_EQ(row->values.size(), 2u);
}

// Bad --kv-events values are refused with the reason: an unknown instance, a wildcard host (the
// engine's bind address, not where to connect), a missing port, a bad replay part.
TEST(ConfigKvEvents, FlagErrors) {
  expect_error(
      parse({"--decode", "127.0.0.1:8200", "--kv-events", "127.0.0.1:9999=tcp://127.0.0.1:5557"}),
      {"--kv-events", "no instance http://127.0.0.1:9999"});
  expect_error(parse({"--decode", "127.0.0.1:8200", "--kv-events", "127.0.0.1:8200=tcp://*:5557"}),
               {"--kv-events", "wildcard"});
  expect_error(parse({"--decode", "127.0.0.1:8200", "--kv-events", "127.0.0.1:8200=tcp://host"}),
               {"--kv-events", "host:port"});
  expect_error(parse({"--decode", "127.0.0.1:8200", "--kv-events",
                      "127.0.0.1:8200=tcp://h:1,again=tcp://h:2"}),
               {"--kv-events", "replay="});
  expect_error(parse({"--decode", "127.0.0.1:8200", "--kv-events", "127.0.0.1:8200"}),
               {"--kv-events", "INSTANCE=tcp://"});
  // The endpoint's host and port are read as a URL's are: garbage is named.
  expect_error(parse({"--decode", "127.0.0.1:8200", "--kv-events", "127.0.0.1:8200=tcp://h st:1"}),
               {"--kv-events", "a space in the host"});
  expect_error(parse({"--decode", "127.0.0.1:8200", "--kv-events", "127.0.0.1:8200=tcp://[zz]:1"}),
               {"--kv-events", "invalid IPv6 address"});
  expect_error(parse({"--decode", "127.0.0.1:8200", "--kv-events", "127.0.0.1:8200=tcp://h:70000"}),
               {"--kv-events", "invalid port '70000'"});
  EXPECT_TRUE(parse({"--decode", "[::1]:8200", "--prefill-servers-urls", "disable", "--kv-events",
                     "[::1]:8200=tcp://[::1]:5557"}));
  expect_error(parse({"--decode", "127.0.0.1:8200", "--tokenizer", "gpt2"}),
               {"--tokenizer", "sim, vllm or none"});
}

// In YAML an instance carries kv_events: {endpoint, replay_endpoint}, or the endpoint alone.
TEST(ConfigKvEvents, YamlInstanceField) {
  TempFile f(R"(
prefill:
  - url: http://10.0.0.1:8100
    kv_events: {endpoint: "tcp://10.0.0.1:5557", replay_endpoint: "tcp://10.0.0.1:5558"}
decode:
  - url: http://10.0.0.2:8200
    kv_events: tcp://10.0.0.2:5557
  - http://10.0.0.3:8200
)");
  auto r = parse({"--config", f.path()});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.prefill[0].kv_events.replay, "tcp://10.0.0.1:5558");
  EXPECT_EQ(r->config.decode[0].kv_events.endpoint, "tcp://10.0.0.2:5557");
  EXPECT_TRUE(r->config.decode[1].kv_events.endpoint.empty());
  TempFile bad(R"(
decode:
  - url: http://10.0.0.2:8200
    kv_events: {endpoint: "tcp://10.0.0.2:5557", bogus: 1}
)");
  expect_error(parse({"--config", bad.path()}), {"kv_events", "bogus"});
}

// Data-parallel engines: --data-parallel URL=N or data_parallel_size in a
// YAML instance; the flag is printed back; an unknown instance, 0 or a
// size past the bound is refused with the reason.
TEST(ConfigDataParallel, FlagAndYamlDeclareRanks) {
  auto r =
      parse({"--prefill", "127.0.0.1:8100", "--decode", "127.0.0.1:8200", "127.0.0.1:8201",
             "--data-parallel", "127.0.0.1:8100=4", "--data-parallel", "http://127.0.0.1:8201=2"});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->config.prefill[0].dp_size, 4u);
  EXPECT_EQ(r->config.decode[0].dp_size, 1u);
  EXPECT_EQ(r->config.decode[1].dp_size, 2u);
  const auto rows = effective_config(r->config);
  const auto row = std::find_if(rows.begin(), rows.end(),
                                [](const ConfigEntry& e) { return e.key == "data-parallel"; });
  ASSERT_NE(row, rows.end());
  EXPECT_EQ(row->values,
            (std::vector<std::string>{"http://127.0.0.1:8100=4", "http://127.0.0.1:8201=2"}));
  TempFile f(R"(
prefill:
  - http://10.0.0.1:8100
decode:
  - url: http://10.0.0.2:8200
    data_parallel_size: 8
)");
  auto y = parse({"--config", f.path()});
  ASSERT_TRUE(y.ok()) << y.error();
  EXPECT_EQ(y->config.decode[0].dp_size, 8u);

  expect_error(parse({"--decode", "127.0.0.1:8200", "--data-parallel", "127.0.0.1:9999=2"}),
               {"--data-parallel", "no prefill or decode instance http://127.0.0.1:9999"});
  expect_error(parse({"--decode", "127.0.0.1:8200", "--data-parallel", "127.0.0.1:8200=0"}),
               {"--data-parallel", "from 1 to 256"});
  expect_error(parse({"--decode", "127.0.0.1:8200", "--data-parallel", "127.0.0.1:8200=257"}),
               {"--data-parallel", "from 1 to 256"});
  expect_error(parse({"--decode", "127.0.0.1:8200", "--data-parallel", "127.0.0.1:8200"}),
               {"--data-parallel", "INSTANCE=RANKS"});
  TempFile bad(R"(
prefill:
  - http://10.0.0.1:8100
decode:
  - url: http://10.0.0.2:8200
    data_parallel_size: 0
)");
  expect_error(parse({"--config", bad.path()}), {"data_parallel_size", "from 1 to 256"});
}

// A rank's spec: its rank set, its event endpoints moved as vLLM moves a
// rank's (tcp port + rank, ipc suffix), its location told apart by rank.
TEST(ConfigDataParallel, RankSpecMovesEventEndpoints) {
  UpstreamSpec engine = *parse_upstream(Role::prefill, "127.0.0.1:8100");
  engine.dp_size = 4;
  engine.kv_events = {"tcp://127.0.0.1:5557", "tcp://127.0.0.1:6000"};
  const UpstreamSpec r2 = rank_spec(engine, 2);
  EXPECT_EQ(r2.dp_rank, 2u);
  EXPECT_EQ(r2.kv_events.endpoint, "tcp://127.0.0.1:5559");
  EXPECT_EQ(r2.kv_events.replay, "tcp://127.0.0.1:6002");
  EXPECT_EQ(rank_spec(engine, 0).kv_events.endpoint, "tcp://127.0.0.1:5557");
  EXPECT_EQ(instance_location(r2), "http://127.0.0.1:8100#dp2");
  EXPECT_EQ(instance_location(engine), "http://127.0.0.1:8100");
  engine.kv_events = {"ipc:///tmp/kv", ""};
  EXPECT_EQ(rank_spec(engine, 3).kv_events.endpoint, "ipc:///tmp/kv_dp3");
  EXPECT_EQ(rank_spec(engine, 3).kv_events.replay, "");
}

}  // namespace
}  // namespace pdgate
