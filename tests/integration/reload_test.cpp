// Operations without a restart: SIGHUP applies an edited config file
// (instance lists, timeouts, labels) and names what needs a restart; an
// invalid edit is refused whole; GET /admin/config shows the live values
// of every option; one engine under two names is refused. Real pdgate and
// pdgate-sim processes.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "core/config/config.hpp"
#include "tests/integration/admin_gateway.hpp"
#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

Json chat(int max_tokens = 2) {
  return {{"model", "sim-model"},
          {"messages", {{{"role", "user"}, {"content", "hi"}}}},
          {"max_tokens", max_tokens},
          {"stream", false}};
}

// The --config file the tests edit.
struct ConfigFile : EditedFile {
  explicit ConfigFile(const std::string& text) : EditedFile("pdgate.yaml", text) {}
};

Json find_url(const Json& instances, const std::string& url) {
  for (const auto& i : instances) {
    if (i["url"] == url)
      return i;
  }
  return nullptr;
}

// Counts occurrences of `what` in the gateway's log.
std::size_t log_count(Process& p, const std::string& what) {
  const std::string log = p.log();
  std::size_t n = 0;
  for (auto at = log.find(what); at != std::string::npos; at = log.find(what, at + 1))
    ++n;
  return n;
}

// The edited file adds a decode, removes one and shortens the first-byte
// timeout; after SIGHUP the registry shows the new list (the kept
// instance under its id, the new one with its YAML labels), a request to
// a hung prefill fails after the new timeout instead of the old 10
// minutes, a large body meets the new memory budget, /admin/config shows
// the new values, and the changed pool size is named as needing a
// restart and left as it was.
TEST(Reload, SighupAppliesInstancesAndTimeouts) {
  Sim p("prefill"), hung("prefill", {"--hang"}), d1("decode"), d2("decode"), d3("decode");
  ConfigFile file("prefill: [" + p.url() + "]\ndecode: [" + d1.url() + ", " + d2.url() +
                  "]\nupstream-max-idle: 8\nhealth-interval: off\n");
  AdminGateway g({"--config", file.path()});
  const auto before = g.instances();
  ASSERT_EQ(before.size(), 3u) << before.dump();
  const auto d1_id = find_url(before, d1.url())["id"];
  ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat()).status, 200);

  file.write("prefill: [" + hung.url() + "]\n" + "decode:\n  - " + d1.url() +
             "\n  - url: " + d3.url() + "\n    labels: {tier: gold}\n    weight: 3\n" +
             "first-byte-timeout: 1s\nupstream-max-idle: 16\nhealth-interval: off\n" +
             "body-memory-limit: 1MiB\n");
  g.gw->process().signal(SIGHUP);
  // The admin API takes the new configuration after the workers were
  // handed theirs: once it shows it, every new request sees it too.
  ASSERT_TRUE(eventually(
      [&] { return g.call("GET", "/admin/config").json()["first-byte-timeout"] == "1s"; },
      std::chrono::seconds(10)))
      << g.gw->process().log();
  ASSERT_TRUE(eventually(
      [&] {
        const auto now = g.instances();
        return find_url(now, d2.url()).is_null() && !find_url(now, d3.url()).is_null() &&
               find_url(now, p.url()).is_null();
      },
      std::chrono::seconds(10)))
      << g.instances().dump();
  const auto after = g.instances();
  EXPECT_EQ(find_url(after, d1.url())["id"], d1_id) << "a kept instance keeps its id";
  EXPECT_EQ(find_url(after, d3.url())["labels"]["tier"], "gold");
  EXPECT_EQ(find_url(after, d3.url())["weight"], 3);
  EXPECT_EQ(find_url(after, hung.url())["state"], "active");

  // The hung prefill is now the only one: the request fails once the new
  // 1 s first-byte timeout passes (the old one was 600 s).
  const auto t0 = Clock::now();
  auto r = post_json(g.port(), "/v1/chat/completions", chat());
  const auto took = Clock::now() - t0;
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_NE(r.body.find("timed out"), std::string::npos) << r.body;
  EXPECT_GE(took, std::chrono::milliseconds(900));
  EXPECT_LT(took, std::chrono::seconds(60));

  // The body memory budget shrank from 1 GiB to 1 MiB: a 3 MiB body being
  // received is refused with 503 once it outgrows it.
  {
    Connection c(g.port());
    c.send_raw(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 3145728\r\n\r\n");
    try {
      for (int i = 0; i < 3; ++i)
        c.send_raw(std::string(1 << 20, 'a'));
    } catch (const std::exception&) {
      // The gateway may close before the last piece: the answer is read below.
    }
    const auto refused = c.read_response(std::chrono::seconds(10));
    EXPECT_EQ(refused.status, 503) << refused.body;
  }

  const auto cfg = g.call("GET", "/admin/config").json();
  EXPECT_EQ(cfg["first-byte-timeout"], "1s") << cfg.dump();
  EXPECT_EQ(cfg["upstream-max-idle"], "8") << "a restart-only key keeps its running value";
  EXPECT_EQ(cfg["restart_needed"], Json::array({"upstream-max-idle"})) << cfg.dump();
  EXPECT_EQ(cfg["reloads"]["applied"], 1);
  EXPECT_EQ(cfg["reloads"]["last_error"], "");
  ASSERT_EQ(cfg["decode"].size(), 2u) << cfg.dump();
  EXPECT_EQ(cfg["decode"][1]["url"], d3.url());
  EXPECT_EQ(cfg["decode"][1]["labels"]["tier"], "gold");
  const std::string log = g.gw->process().log();
  EXPECT_NE(log.find("upstream-max-idle changed but needs a restart; still running with 8"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("first-byte-timeout"), std::string::npos) << log;
}

// An edit that is wrong in two ways (a bad duration, one decode engine
// listed under two names) is refused whole: both faults are logged, and
// the instance list and timeouts stay as they were.
TEST(Reload, InvalidEditIsRefusedWhole) {
  Sim p("prefill"), d1("decode"), d2("decode");
  ConfigFile file("prefill: [" + p.url() + "]\ndecode: [" + d1.url() +
                  "]\nconnect-timeout: 3s\nhealth-interval: off\n");
  AdminGateway g({"--config", file.path()});

  // d1 as "localhost:PORT" and "127.0.0.1:PORT": the same engine.
  const std::string alias = "localhost:" + std::to_string(d1.port());
  file.write("prefill: [" + p.url() + "]\ndecode: [" + d1.url() + ", " + alias + ", " + d2.url() +
             "]\nconnect-timeout: 4s\nhealth-interval: off\n");
  g.gw->process().signal(SIGHUP);
  const auto refusals = [&] {
    return g.call("GET", "/admin/config").json()["reloads"]["refused"].get<int>();
  };
  ASSERT_TRUE(eventually([&] { return refusals() == 1; }, std::chrono::seconds(10)))
      << g.gw->process().log();
  std::string log = g.gw->process().log();
  EXPECT_NE(log.find("is " + d1.url() + " again"), std::string::npos) << log;
  EXPECT_EQ(g.instances().size(), 2u) << g.instances().dump();
  auto cfg = g.call("GET", "/admin/config").json();
  EXPECT_EQ(cfg["connect-timeout"], "3s");
  EXPECT_EQ(cfg["reloads"]["refused"], 1) << cfg["reloads"].dump();
  EXPECT_NE(cfg["reloads"]["last_error"].get<std::string>().find("again"), std::string::npos)
      << cfg["reloads"].dump();

  file.write("prefill: [" + p.url() + "]\ndecode: [" + d1.url() + ", " + d2.url() +
             "]\nconnect-timeout: soon\nfirst-byte-timeout: never\nhealth-interval: off\n");
  g.gw->process().signal(SIGHUP);
  ASSERT_TRUE(eventually([&] { return refusals() == 2; }, std::chrono::seconds(10)));
  EXPECT_EQ(log_count(g.gw->process(), "configuration refused"), 2u);
  log = g.gw->process().log();
  EXPECT_NE(log.find("'soon'"), std::string::npos) << log;
  EXPECT_NE(log.find("'never'"), std::string::npos) << log;
  EXPECT_EQ(g.instances().size(), 2u);
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat()).status, 200);
  EXPECT_TRUE(d2.requests().empty()) << "the refused list must not be applied";
}

// GET /admin/config lists every option --help documents (but those only
// the command line takes), and masks secrets: the Redis password.
TEST(Reload, AdminConfigListsEveryOptionMasked) {
  Sim p("prefill"), d("decode");
  AdminGateway g({"--prefill", p.hostport(), "--decode", d.hostport(), "--redis",
                  "redis://:hunter2@127.0.0.1:" + std::to_string(closed_port()), "--redis-timeout",
                  "20ms"});
  const auto r = g.call("GET", "/admin/config");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body.find("hunter2"), std::string::npos) << r.body;
  const auto cfg = r.json();
  EXPECT_NE(cfg["redis"].get<std::string>().find("***"), std::string::npos);

  // Every option a config file may set (the unit tests check that these
  // are all of --help's), by the flag's name.
  std::size_t options = 0;
  for (const auto& e : effective_config(Config{})) {
    ++options;
    EXPECT_TRUE(cfg.contains(e.key)) << e.key << " missing from /admin/config";
  }
  EXPECT_GE(options, 55u);
}

// The same engine under another name is refused: an admin add answers 409
// naming the instance it duplicates; a config listing it twice does not
// start (exit 2, both names in the message).
TEST(Reload, DuplicateByResolvedAddressRefused) {
  Sim p("prefill"), d("decode");
  AdminGateway g({"--prefill", p.hostport(), "--decode", d.hostport()});
  const std::string alias = "http://localhost:" + std::to_string(d.port());
  auto r = g.call("POST", "/admin/instances", {{"role", "decode"}, {"url", alias}});
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_NE(r.body.find(d.url()), std::string::npos) << r.body;
  EXPECT_EQ(g.instances().size(), 2u);
  // Another role is another instance: the same engine may serve both.
  r = g.call("POST", "/admin/instances", {{"role", "prefill"}, {"url", alias}});
  EXPECT_EQ(r.status, 201) << r.body;

  Process twice("pdgate-twice", {build_dir() + "/pdgate", "--port", "0", "--prefill", p.hostport(),
                                 "--decode", d.hostport(), alias});
  const int st = twice.wait(std::chrono::seconds(20));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << st;
  const std::string log = twice.log();
  EXPECT_NE(log.find(alias), std::string::npos) << log;
  EXPECT_NE(log.find(d.url()), std::string::npos) << log;
}

// Labels and weights written in the YAML instance list reach a policy as
// the admin API's do: a script that picks the "gold" decode sends every
// request to it, and sees its weight.
TEST(Reload, YamlLabelsReachThePolicy) {
  Sim p("prefill"), d1("decode"), d2("decode");
  EditedFile script("gold.lua",
                    "return { pick = function(ctx, instances)\n"
                    "  for _, i in ipairs(instances) do\n"
                    "    if i.labels.tier == 'gold' and i.weight == 5 then return i end\n"
                    "  end\n"
                    "  return instances[1]\n"
                    "end }\n");
  ConfigFile file(
      "prefill: [" + p.url() + "]\ndecode:\n  - " + d1.url() + "\n  - url: " + d2.url() +
      "\n    labels: {tier: gold}\n    weight: 5\npolicy-decode: " + script.path() + "\n");
  AdminGateway g({"--config", file.path()});
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat()).status, 200);
  EXPECT_EQ(d2.requests().size(), 4u) << "the policy did not see the YAML labels";
  EXPECT_TRUE(d1.requests().empty());
  const auto listed = find_url(g.instances(), d2.url());
  EXPECT_EQ(listed["labels"]["tier"], "gold");
  EXPECT_EQ(listed["weight"], 5);
}

// Reloads under traffic lose no request: while clients send requests
// without pause, SIGHUP swaps the decode list back and forth and changes a
// timeout each time; every request is answered 200, and both lists served.
TEST(Reload, ReloadsUnderTrafficLoseNoRequest) {
  Sim p("prefill"), d1("decode", {"--itl-ms", "5"}), d2("decode", {"--itl-ms", "5"}),
      d3("decode", {"--itl-ms", "5"});
  const auto config = [&](Sim& second, int timeout_s) {
    return "prefill: [" + p.url() + "]\ndecode: [" + d1.url() + ", " + second.url() +
           "]\nfirst-byte-timeout: " + std::to_string(timeout_s) + "s\nhealth-interval: off\n";
  };
  ConfigFile file(config(d2, 30));
  AdminGateway g({"--config", file.path()});
  std::atomic<bool> done{false};
  std::atomic<int> ok{0}, bad{0};
  std::vector<std::thread> clients;
  // Stops and joins the clients however the test ends (an ASSERT returns).
  struct Join {
    std::atomic<bool>& done;
    std::vector<std::thread>& threads;
    ~Join() {
      done = true;
      for (auto& t : threads) {
        if (t.joinable())
          t.join();
      }
    }
  } join{done, clients};
  for (int t = 0; t < 3; ++t) {
    clients.emplace_back([&] {
      while (!done.load()) {
        const auto r = post_json(g.port(), "/v1/chat/completions", chat(8));
        (r.status == 200 ? ok : bad).fetch_add(1);
      }
    });
  }
  for (int i = 1; i <= 6; ++i) {
    file.write(config(i % 2 == 1 ? d3 : d2, 30 + i));
    g.gw->process().signal(SIGHUP);
    const std::string want = std::to_string(30 + i) + "s";
    ASSERT_TRUE(eventually(
        [&] { return g.call("GET", "/admin/config").json()["first-byte-timeout"] == want; },
        std::chrono::seconds(10)));
    // Some traffic on this list before the next swap.
    const int seen = ok.load();
    ASSERT_TRUE(eventually([&] { return ok.load() >= seen + 3; }, std::chrono::seconds(20)));
  }
  done = true;
  for (auto& c : clients)
    c.join();
  EXPECT_EQ(bad.load(), 0) << ok.load() << " answered 200";
  EXPECT_GE(ok.load(), 18);
  EXPECT_FALSE(d2.requests().empty());
  EXPECT_FALSE(d3.requests().empty());
  EXPECT_EQ(g.call("GET", "/admin/config").json()["reloads"]["applied"], 6);
}

}  // namespace
}  // namespace pdgate::test
