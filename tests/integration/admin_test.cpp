// The admin API, health checking, failover before the first byte and
// /metrics, against real pdgate and pdgate-sim processes.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cctype>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/integration/admin_gateway.hpp"
#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

const std::string& kKey = kAdminKey;

Json chat(bool stream, int max_tokens = 3) {
  return {{"model", "sim-model"},
          {"messages", {{{"role", "user"}, {"content", "hi"}}}},
          {"max_tokens", max_tokens},
          {"stream", stream}};
}

// How a process ended, for failure messages: "killed by signal 11" says SIGSEGV.
std::string fate(Process& proc, std::chrono::milliseconds wait_at_most = std::chrono::seconds(1)) {
  const int st = proc.wait(wait_at_most);
  if (st == -1)
    return "still running";
  if (WIFSIGNALED(st))
    return "killed by signal " + std::to_string(WTERMSIG(st));
  return "exited with " + std::to_string(WEXITSTATUS(st));
}

std::vector<std::string> pd_args(Sim& p, std::initializer_list<Sim*> decodes) {
  std::vector<std::string> a = {"--prefill", p.hostport(), "--decode"};
  for (auto* d : decodes)
    a.push_back(d->hostport());
  return a;
}

// Missing key -> 401, wrong key -> 403, and the instance set is unchanged.
TEST(AdminApi, MissingOrWrongKeyIsRefusedAndChangesNothing) {
  Sim p("prefill"), d("decode"), extra("decode");
  AdminGateway g(pd_args(p, {&d}));
  const Json add = {{"role", "decode"}, {"url", extra.url()}};
  EXPECT_EQ(g.call("POST", "/admin/instances", add, {}).status, 401);
  EXPECT_EQ(g.call("POST", "/admin/instances", add, {{"X-API-Key", "wrong"}}).status, 403);
  EXPECT_EQ(g.call("POST", "/admin/instances", add, {{"Authorization", "Bearer wrong"}}).status,
            403);
  EXPECT_EQ(g.call("GET", "/admin/instances", nullptr, {}).status, 401);
  EXPECT_EQ(http_request(g.port(), "POST", "/instances/add",
                         Json{{"type", "decode"}, {"instance", extra.hostport()}}.dump(),
                         {{"X-API-Key", "nope"}, {"Content-Type", "application/json"}})
                .status,
            403);
  EXPECT_EQ(g.instances().size(), 2u);
  EXPECT_EQ(g.call("POST", "/admin/instances/1/drain", nullptr, {}).status, 401);
  EXPECT_EQ(g.instance_by_url(p.url())["state"], "active");
  // The right key as a bearer token works.
  EXPECT_EQ(g.call("POST", "/admin/instances", add, {{"Authorization", "Bearer " + kKey}}).status,
            201);
  EXPECT_EQ(g.instances().size(), 3u);
}

// With no key configured, reads work and changes are refused with a message saying why.
TEST(AdminApi, NoKeyConfiguredRefusesChanges) {
  Sim p("prefill"), d("decode"), extra("decode");
  AdminGateway g(pd_args(p, {&d}), {});
  auto r = g.call("POST", "/admin/instances", {{"role", "decode"}, {"url", extra.url()}}, {});
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(r.body.find("ADMIN_API_KEY"), std::string::npos) << r.body;
  EXPECT_EQ(g.call("GET", "/admin/instances", nullptr, {}).status, 200);
  EXPECT_EQ(g.instances().size(), 2u);
}

// Bad URLs -> 400, duplicates -> 409, outside --allowed-upstreams -> 403, wrong model -> 422.
TEST(AdminApi, AddValidatesUrlDuplicatesAllowListAndModel) {
  Sim p("prefill"), d("decode"), other_model("decode", {"--model", "other-model"});
  AdminGateway g(pd_args(p, {&d}));
  EXPECT_EQ(g.call("POST", "/admin/instances", {{"role", "decode"}, {"url", "ftp://x:1"}}).status,
            400);
  EXPECT_EQ(
      g.call("POST", "/admin/instances", {{"role", "decode"}, {"url", "http://x:99999"}}).status,
      400);
  EXPECT_EQ(g.call("POST", "/admin/instances", {{"role", "decode"}, {"url", "http://x"}}).status,
            400);
  EXPECT_EQ(g.call("POST", "/admin/instances", {{"role", "nope"}, {"url", d.url()}}).status, 400);
  EXPECT_EQ(g.call("POST", "/admin/instances", {{"role", "decode"}, {"url", d.url()}}).status, 409);
  EXPECT_EQ(g.instances().size(), 2u);

  // SSRF guard: only 10.0.0.0/8 allowed, so loopback is refused.
  Sim extra("decode");
  AdminGateway fenced([&] {
    auto a = pd_args(p, {&d});
    a.insert(a.end(), {"--allowed-upstreams", "10.0.0.0/8"});
    return a;
  }());
  auto r = fenced.call("POST", "/admin/instances", {{"role", "decode"}, {"url", extra.url()}});
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_NE(r.body.find("allowed-upstreams"), std::string::npos) << r.body;
  EXPECT_EQ(fenced.instances().size(), 2u);

  // --model: an instance serving another model is not added.
  AdminGateway modelled([&] {
    auto a = pd_args(p, {&d});
    a.insert(a.end(), {"--model", "sim-model", "--allowed-upstreams", "127.0.0.0/8"});
    return a;
  }());
  r = modelled.call("POST", "/admin/instances", {{"role", "decode"}, {"url", other_model.url()}});
  EXPECT_EQ(r.status, 422) << r.body;
  r = modelled.call("POST", "/admin/instances", {{"role", "decode"}, {"url", extra.url()}});
  EXPECT_EQ(r.status, 201) << r.body;
}

// An instance added at run time (admin API, or the demo's /instances/add) takes traffic.
TEST(AdminApi, AddedInstancesTakeTraffic) {
  Sim p("prefill"), d("decode"), d2("decode"), d3("decode");
  AdminGateway g(pd_args(p, {&d}));
  auto r =
      g.call("POST", "/admin/instances",
             {{"role", "decode"}, {"url", d2.url()}, {"labels", {{"zone", "a"}}}, {"weight", 2}});
  ASSERT_EQ(r.status, 201) << r.body;
  EXPECT_EQ(r.json()["labels"]["zone"], "a");
  EXPECT_EQ(r.json()["weight"], 2);
  // vLLM demo proxy compatibility, on the client port.
  auto demo = http_request(g.port(), "POST", "/instances/add",
                           Json{{"type", "decode"}, {"instance", d3.hostport()}}.dump(),
                           {{"X-API-Key", kKey}, {"Content-Type", "application/json"}});
  ASSERT_EQ(demo.status, 201) << demo.body;
  EXPECT_EQ(g.gw->status()["decode_node_count"], 3);
  for (int i = 0; i < 9; ++i)
    ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat(false)).status, 200);
  EXPECT_FALSE(d2.requests().empty());
  EXPECT_FALSE(d3.requests().empty());
}

// A drained instance gets no new request while its stream finishes; remove forgets it.
TEST(AdminApi, DrainedInstanceFinishesStreamsAndGetsNoNewRequests) {
  Sim p("prefill"), d1("decode", {"--itl-ms", "50"}), d2("decode");
  AdminGateway g(pd_args(p, {&d1, &d2}));
  // Round-robin: alternate until a stream lands on d1.
  std::unique_ptr<Connection> on_d1;
  for (int i = 0; i < 4 && !on_d1; ++i) {
    auto c = std::make_unique<Connection>(g.port());
    c->send_request("POST", "/v1/chat/completions", chat(true, 30).dump(),
                    {{"Content-Type", "application/json"}});
    auto head = c->read_head();
    ASSERT_EQ(head.status, 200);
    if (d1.requests().size() == 1) {
      on_d1 = std::move(c);
    } else {
      while (!c->read_body_some().empty()) {
      }
    }
  }
  ASSERT_TRUE(on_d1);
  const auto id = g.instance_by_url(d1.url())["id"].get<int>();
  ASSERT_EQ(g.call("POST", "/admin/instances/" + std::to_string(id) + "/drain").status, 200);
  EXPECT_EQ(g.instance_by_url(d1.url())["state"], "draining");
  for (int i = 0; i < 6; ++i)
    ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat(false)).status, 200);
  EXPECT_EQ(d1.requests().size(), 1u);
  std::string body;
  for (std::string piece; !(piece = on_d1->read_body_some()).empty();)
    body += piece;
  EXPECT_NE(body.find("[DONE]"), std::string::npos) << body;
  // Remove: forgotten once idle.
  ASSERT_EQ(g.call("DELETE", "/admin/instances/" + std::to_string(id)).status, 202);
  EXPECT_TRUE(eventually([&] { return g.instance_by_url(d1.url()).is_null(); }));
}

// Relabelling in place: PATCH changes labels and weight under the same id
// (the same metric series), a policy that routes by label follows at once,
// and bad bodies are refused with the reason.
TEST(AdminApi, PatchRelabelsInPlaceAndPoliciesFollow) {
  const std::string script =
      std::string(::testing::TempDir()) + "/gold-" + std::to_string(::getpid()) + ".lua";
  {
    std::ofstream f(script);
    f << "return { pick = function(ctx, instances)\n"
         "  for _, i in ipairs(instances) do\n"
         "    if i.labels.tier == 'gold' then return i end\n"
         "  end\n"
         "  return instances[1]\n"
         "end }\n";
  }
  Sim p("prefill"), d1("decode"), d2("decode");
  auto args = pd_args(p, {&d1, &d2});
  args.insert(args.end(), {"--policy-decode", script});
  AdminGateway g(args);
  const auto id2 = g.instance_by_url(d2.url())["id"].get<int>();
  const std::string path = "/admin/instances/" + std::to_string(id2);
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat(false)).status, 200);
  EXPECT_EQ(d2.requests().size(), 0u);

  auto r = g.call("PATCH", path, {{"labels", {{"tier", "gold"}}}, {"weight", 7}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["id"], id2);
  EXPECT_EQ(r.json()["labels"]["tier"], "gold");
  EXPECT_EQ(r.json()["weight"], 7);
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat(false)).status, 200);
  EXPECT_EQ(d2.requests().size(), 3u) << "the policy did not see the new label";
  EXPECT_EQ(g.instance_by_url(d2.url())["weight"], 7);

  // Labels only: the weight stays.
  r = g.call("PATCH", path, {{"labels", Json::object()}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["weight"], 7);
  EXPECT_TRUE(r.json()["labels"].empty());

  EXPECT_EQ(g.call("PATCH", path, {{"weight", 0}}).status, 400);
  EXPECT_EQ(g.call("PATCH", path, {{"labels", {{"tier", 1}}}}).status, 400);
  auto bad = g.call("PATCH", path, {{"url", "http://elsewhere:1"}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("url"), std::string::npos) << bad.body;
  EXPECT_EQ(g.call("PATCH", "/admin/instances/999", {{"weight", 2}}).status, 404);
  EXPECT_EQ(http_request(g.admin, "PATCH", path, R"({"weight": 2})",
                         {{"Content-Type", "application/json"}})
                .status,
            401);
  std::remove(script.c_str());
}

// Labels are bounded (issue 32, item 2; LabelLimits in core/config/config.hpp):
// an add or a PATCH past the bounds is refused with 400 and an OpenAI-style
// error naming the labels, and changes nothing. Before the bounds, two adds
// with 900 KB of labels each were accepted, and the next request's pick
// copied them into a policy state of --policy-memory 1MiB: the gateway died
// with SIGSEGV. Labels within the bounds (64 labels) are accepted.
TEST(AdminApi, OversizedLabelsAreRefusedAndPoliciesSurvive) {
  Sim p("prefill"), d("decode"), e1("decode"), e2("decode");
  auto args = pd_args(p, {&d});
  args.insert(args.end(), {"--policy", "least_load", "--policy-memory", "1MiB", "--workers", "1"});
  AdminGateway g(args);
  for (Sim* e : {&e1, &e2}) {
    // Distinct per instance: Lua would share two equal strings.
    const std::string blob(900 * 1000, e == &e1 ? 'x' : 'y');
    auto r = g.call("POST", "/admin/instances",
                    {{"role", "decode"}, {"url", e->url()}, {"labels", {{"blob", blob}}}});
    EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
    if (r.status == 400) {
      EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("label"), std::string::npos)
          << r.body;
    }
  }
  for (int i = 0; i < 6; ++i) {
    auto r = http_request(g.port(), "POST", "/v1/chat/completions", chat(false).dump(),
                          {{"Content-Type", "application/json"}}, std::chrono::seconds(5));
    ASSERT_EQ(r.status, 200) << "request " << i << ": " << fate(g.gw->process());
  }
  EXPECT_TRUE(g.instance_by_url(e1.url()).is_null());

  const auto id = g.instance_by_url(d.url())["id"].get<int>();
  const std::string path = "/admin/instances/" + std::to_string(id);
  Json many = Json::object();
  for (int i = 0; i < 65; ++i)
    many["k" + std::to_string(i)] = "v";
  EXPECT_EQ(g.call("PATCH", path, {{"labels", many}}).status, 400);
  EXPECT_EQ(g.call("PATCH", path, {{"labels", {{std::string(129, 'k'), "v"}}}}).status, 400);
  EXPECT_EQ(g.call("PATCH", path, {{"labels", {{"", "v"}}}}).status, 400);
  EXPECT_TRUE(g.instance_by_url(d.url())["labels"].empty());
  many.erase("k64");
  auto ok =
      g.call("POST", "/admin/instances", {{"role", "decode"}, {"url", e2.url()}, {"labels", many}});
  ASSERT_EQ(ok.status, 201) << ok.body;
  EXPECT_EQ(ok.json()["labels"].size(), 64u);
  EXPECT_EQ(post_json(g.port(), "/v1/chat/completions", chat(false)).status, 200);
}

// The same bounds hold in the config file: a label past them is a
// configuration error (exit 2) naming the instance and the label.
TEST(AdminApi, OversizedLabelInConfigFileIsAConfigError) {
  EditedFile file("pdgate.yaml", "decode:\n  - url: http://127.0.0.1:1\n    labels: {blob: " +
                                     std::string(2000, 'x') + "}\nkv-connector: none\n");
  Process proc("pdgate", {build_dir() + "/pdgate", "--config", file.path()});
  const int st = proc.wait(std::chrono::seconds(10));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << st << "\n" << proc.log();
  EXPECT_NE(proc.log().find("label 'blob' has a value longer than 1024 bytes"), std::string::npos)
      << proc.log();
}

// Undrain: a drained instance goes back into service under its id; an
// instance being removed cannot be undrained (409).
TEST(AdminApi, UndrainPutsAnInstanceBackInService) {
  Sim p("prefill"), d1("decode"), d2("decode");
  AdminGateway g(pd_args(p, {&d1, &d2}));
  const auto id1 = g.instance_by_url(d1.url())["id"].get<int>();
  const std::string path = "/admin/instances/" + std::to_string(id1);
  ASSERT_EQ(g.call("POST", path + "/drain").status, 200);
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat(false)).status, 200);
  EXPECT_EQ(d1.requests().size(), 0u);
  auto r = g.call("POST", path + "/undrain");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["state"], "active");
  EXPECT_EQ(r.json()["id"], id1);
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat(false)).status, 200);
  EXPECT_EQ(d1.requests().size(), 2u) << "round-robin over both again";
  // Undraining an active instance changes nothing.
  EXPECT_EQ(g.call("POST", path + "/undrain").status, 200);
  EXPECT_EQ(g.call("GET", path + "/undrain").status, 405);
  // Being removed (a stream still runs on it, so it is not forgotten
  // yet): too late to undrain.
  Sim slow("decode", {"--itl-ms", "50"});
  ASSERT_EQ(g.call("POST", "/admin/instances", {{"role", "decode"}, {"url", slow.url()}}).status,
            201);
  const auto slow_id = g.instance_by_url(slow.url())["id"].get<int>();
  ASSERT_EQ(g.call("POST", path + "/drain").status, 200);
  const auto id2 = g.instance_by_url(d2.url())["id"].get<int>();
  ASSERT_EQ(g.call("POST", "/admin/instances/" + std::to_string(id2) + "/drain").status, 200);
  Connection busy(g.port());
  busy.send_request("POST", "/v1/chat/completions", chat(true, 100).dump(),
                    {{"Content-Type", "application/json"}});
  ASSERT_EQ(busy.read_head().status, 200);
  const std::string slow_path = "/admin/instances/" + std::to_string(slow_id);
  ASSERT_EQ(g.call("DELETE", slow_path).status, 202);
  EXPECT_EQ(g.call("POST", slow_path + "/undrain").status, 409);
  EXPECT_EQ(g.instance_by_url(slow.url())["state"], "draining");
}

// The issue's reproduction: DELETE of an instance while a stream runs on it, then POST
// .../drain in a loop while the stream ends: every answer is JSON 200 (still draining) or 404
// (forgotten once idle), pdgate keeps running and the stream completes.
TEST(AdminRaces, DrainLoopAfterDeleteWhileBusyDoesNotCrash) {
  Sim p("prefill"), d1("decode", {"--itl-ms", "50"});
  AdminGateway g(pd_args(p, {&d1}));
  Connection stream(g.port());
  stream.send_request("POST", "/v1/chat/completions", chat(true, 20).dump(),
                      {{"Content-Type", "application/json"}});
  ASSERT_EQ(stream.read_head().status, 200);
  ASSERT_EQ(d1.requests().size(), 1u);
  const auto id = std::to_string(g.instance_by_url(d1.url())["id"].get<int>());
  ASSERT_EQ(g.call("DELETE", "/admin/instances/" + id).status, 202);
  int drains = 0, forgotten = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline && forgotten == 0) {
    Response r;
    ASSERT_NO_THROW(r = g.call("POST", "/admin/instances/" + id + "/drain"))
        << "after " << drains << " drains; pdgate " << fate(g.gw->process());
    ASSERT_TRUE(r.status == 200 || r.status == 404) << r.status << " " << r.body;
    ASSERT_NO_THROW(r.json()) << r.body;
    if (r.status == 200) {
      EXPECT_EQ(r.json()["state"], "draining");
    }
    ++drains;
    forgotten += r.status == 404 ? 1 : 0;
  }
  EXPECT_EQ(forgotten, 1) << "still listed after " << drains << " drains";
  EXPECT_TRUE(g.gw->process().running());
  EXPECT_EQ(http_request(g.admin, "GET", "/health").status, 200);
  std::string body;
  for (std::string piece; !(piece = stream.read_body_some()).empty();)
    body += piece;
  EXPECT_NE(body.find("[DONE]"), std::string::npos) << body;
  EXPECT_TRUE(g.instance_by_url(d1.url()).is_null());
}

// Four admin clients add, drain, delete and read the same instances (on the admin port and
// the client port's /instances/add) for 4 s while streams run through them: every admin
// answer is JSON with status 200/201/202/404/409, pdgate keeps running, client requests keep
// succeeding, and the final instance list has each URL once and nothing left in flight.
TEST(AdminRaces, ConcurrentAddDrainDeleteUnderTrafficNeverCrash) {
  Sim p("prefill"), fixed("decode", {"--itl-ms", "20"});
  std::vector<std::unique_ptr<Sim>> extras;
  for (int i = 0; i < 3; ++i)
    extras.push_back(std::make_unique<Sim>("decode", std::vector<std::string>{"--itl-ms", "20"}));
  AdminGateway g(
      {"--prefill", p.hostport(), "--decode", fixed.hostport(), "--health-interval", "200ms"});
  const int first_free_id = 3;  // 1 and 2 are p and fixed: never touched
  std::atomic<int> max_id{first_free_id};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> problems;
  std::map<int, int> admin_statuses, client_statuses;
  auto note = [&](std::map<int, int>& tally, int status, std::string problem) {
    std::lock_guard lock(mu);
    ++tally[status];
    if (!problem.empty() && problems.size() < 20)
      problems.push_back(std::move(problem));
  };
  auto admin_client = [&](unsigned seed) {
    std::mt19937 rng(seed);
    while (!stop.load()) {
      const auto& sim = *extras[rng() % extras.size()];
      const std::string id =
          std::to_string(first_free_id + rng() % (max_id.load() - first_free_id + 3));
      Response r;
      std::set<int> allowed;
      try {
        switch (rng() % 6) {
          case 0:
            r = g.call("POST", "/admin/instances", {{"role", "decode"}, {"url", sim.url()}});
            allowed = {201, 409};
            break;
          case 1:
            r = http_request(g.port(), "POST", "/instances/add",
                             Json{{"type", "decode"}, {"instance", sim.hostport()}}.dump(),
                             {{"X-API-Key", kKey}, {"Content-Type", "application/json"}});
            allowed = {201, 409};
            break;
          case 2:
            r = g.call("POST", "/admin/instances/" + id + "/drain");
            allowed = {200, 404};
            break;
          case 3:
            r = g.call("DELETE", "/admin/instances/" + id);
            allowed = {202, 404};
            break;
          case 4:
            r = g.call("GET", "/admin/instances/" + id);
            allowed = {200, 404};
            break;
          default:
            r = g.call("GET", "/admin/instances");
            allowed = {200};
            break;
        }
      } catch (const std::exception& e) {
        note(admin_statuses, 0, std::string("admin call failed: ") + e.what());
        return;
      }
      std::string problem;
      if (!allowed.count(r.status))
        problem = "status " + std::to_string(r.status) + ": " + r.body;
      Json j = Json::parse(r.body, nullptr, false);
      if (j.is_discarded())
        problem = "not JSON: " + r.body;
      if (r.status == 201 && j.contains("id")) {
        for (int seen = max_id.load(); j["id"].get<int>() > seen;)
          max_id.compare_exchange_weak(seen, j["id"].get<int>());
      }
      note(admin_statuses, r.status, std::move(problem));
    }
  };
  auto traffic = [&] {
    while (!stop.load()) {
      Response r;
      try {
        r = post_json(g.port(), "/v1/chat/completions", chat(true, 5));
      } catch (const std::exception& e) {
        note(client_statuses, 0, std::string("client request failed: ") + e.what());
        return;
      }
      note(client_statuses, r.status,
           r.status == 200 ? "" : "client got " + std::to_string(r.status) + ": " + r.body);
    }
  };
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < 4; ++i)
    threads.emplace_back(admin_client, 1000 + i);
  for (int i = 0; i < 4; ++i)
    threads.emplace_back(traffic);
  std::this_thread::sleep_for(std::chrono::seconds(4));
  stop = true;
  for (auto& t : threads)
    t.join();

  std::string summary;
  for (const auto& [status, n] : admin_statuses)
    summary += " admin " + std::to_string(status) + " x" + std::to_string(n);
  for (const auto& [status, n] : client_statuses)
    summary += " client " + std::to_string(status) + " x" + std::to_string(n);
  ASSERT_EQ(fate(g.gw->process(), std::chrono::milliseconds(0)), "still running") << summary;
  EXPECT_TRUE(problems.empty()) << summary << "\n" << problems.front();
  EXPECT_GT(client_statuses[200], 0) << summary;
  EXPECT_GT(admin_statuses[201], 0) << summary;
  EXPECT_GT(admin_statuses[202], 0) << summary;
  EXPECT_EQ(http_request(g.admin, "GET", "/health").status, 200);
  Json final;
  EXPECT_TRUE(eventually([&] {
    final = g.instances();
    for (const auto& i : final) {
      if (i["in_flight"] != 0)
        return false;
    }
    return true;
  })) << final.dump();
  std::set<int> ids;
  std::set<std::string> urls;
  for (const auto& i : final) {
    EXPECT_TRUE(ids.insert(i["id"].get<int>()).second) << final.dump();
    EXPECT_TRUE(urls.insert(i["url"].get<std::string>()).second) << final.dump();
  }
  // The fixed instances were never touched and still serve.
  EXPECT_EQ(g.instance_by_url(fixed.url())["state"], "active");
  EXPECT_EQ(post_json(g.port(), "/v1/chat/completions", chat(false)).status, 200);
  std::cout << "[ measured ]" << summary << "\n";
}

// A prefill answering 500 is retried on the other prefill; the client sees success.
TEST(Failover, PrefillErrorIsRetriedElsewhere) {
  Sim bad("prefill", {"--error-rate", "1"}), good("prefill"), d("decode");
  AdminGateway g({"--prefill", bad.hostport(), good.hostport(), "--decode", d.hostport(),
                  "--eject-after", "1000"});
  for (int i = 0; i < 6; ++i) {
    auto r = post_json(g.port(), "/v1/chat/completions", chat(i % 2 == 0));
    ASSERT_EQ(r.status, 200) << r.body << g.gw->process().log();
  }
  EXPECT_FALSE(bad.requests().empty());
  EXPECT_EQ(d.requests().size(), 6u);
}

// A decode answering 500 before any byte is retried, with a fresh prefill, on another decode.
TEST(Failover, DecodeErrorBeforeFirstByteIsRetriedWithFreshPrefill) {
  Sim p("prefill"), bad("decode", {"--error-rate", "1"}), good("decode");
  AdminGateway g({"--prefill", p.hostport(), "--decode", bad.hostport(), good.hostport(),
                  "--eject-after", "1000"});
  for (int i = 0; i < 6; ++i) {
    auto r = post_json(g.port(), "/v1/chat/completions", chat(true));
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_FALSE(bad.requests().empty());
  EXPECT_EQ(good.requests().size(), 6u);
  // Each retried request had its own second prefill.
  EXPECT_EQ(p.requests().size(), 6u + bad.requests().size());
}

// A killed decode is ejected, requests keep succeeding, and it is re-admitted when it is back.
TEST(Health, KilledDecodeIsEjectedAndReadmitted) {
  Sim p("prefill"), d2("decode");
  auto d1 = std::make_unique<Sim>("decode");
  const auto d1_port = d1->port();
  const std::string d1_url = d1->url();
  AdminGateway g({"--prefill", p.hostport(), "--decode", d1->hostport(), d2.hostport(),
                  "--health-interval", "200ms", "--health-rise", "2", "--health-fall", "2"});
  d1.reset();  // killed
  for (int i = 0; i < 10; ++i) {
    auto r = post_json(g.port(), "/v1/chat/completions", chat(i % 2 == 0));
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_TRUE(eventually([&] { return g.instance_by_url(d1_url)["state"] == "ejected"; }));
  d1 = std::make_unique<Sim>("decode", std::vector<std::string>{"--port", std::to_string(d1_port)});
  EXPECT_TRUE(eventually([&] { return g.instance_by_url(d1_url)["state"] == "active"; },
                         std::chrono::seconds(10)));
  for (int i = 0; i < 6; ++i)
    ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat(false)).status, 200);
  EXPECT_FALSE(d1->requests().empty());
}

// With every decode ejected the gateway answers 503 at once, naming the stage.
TEST(Health, NoHealthyInstanceAnswers503) {
  Sim p("prefill");
  auto d = std::make_unique<Sim>("decode");
  AdminGateway g({"--prefill", p.hostport(), "--decode", d->hostport(), "--health-interval",
                  "200ms", "--health-fall", "1"});
  d.reset();
  EXPECT_TRUE(eventually([&] { return g.instances()[1]["state"] == "ejected"; }));
  auto r = post_json(g.port(), "/v1/chat/completions", chat(false));
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("no healthy decode"), std::string::npos) << r.body;
}

// A strict parser for the Prometheus text format (0.0.4): every sample line
// is name{labels} value, every family has HELP and TYPE before its samples.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

std::vector<Sample> parse_prometheus(const std::string& text) {
  std::vector<Sample> out;
  std::set<std::string> typed;
  std::istringstream in(text);
  std::string line;
  auto is_name_char = [](char c, bool first) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
           (!first && std::isdigit(static_cast<unsigned char>(c)));
  };
  while (std::getline(in, line)) {
    if (line.empty())
      continue;
    if (line.rfind("# HELP ", 0) == 0)
      continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      if (type != "counter" && type != "gauge" && type != "histogram")
        throw std::runtime_error("bad TYPE: " + line);
      if (!typed.insert(name).second)
        throw std::runtime_error("TYPE twice: " + line);
      continue;
    }
    if (line[0] == '#')
      throw std::runtime_error("unknown comment: " + line);
    Sample s;
    std::size_t i = 0;
    while (i < line.size() && is_name_char(line[i], i == 0))
      ++i;
    if (i == 0)
      throw std::runtime_error("no metric name: " + line);
    s.name = line.substr(0, i);
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        std::size_t k = i;
        while (k < line.size() && is_name_char(line[k], k == i))
          ++k;
        if (k == i || k >= line.size() || line[k] != '=' || line[k + 1] != '"')
          throw std::runtime_error("bad label: " + line);
        const std::string key = line.substr(i, k - i);
        std::string value;
        std::size_t v = k + 2;
        for (; v < line.size() && line[v] != '"'; ++v) {
          if (line[v] == '\\') {
            ++v;
            if (v >= line.size())
              throw std::runtime_error("bad escape: " + line);
            value += line[v] == 'n' ? '\n' : line[v];
          } else {
            value += line[v];
          }
        }
        if (v >= line.size())
          throw std::runtime_error("unterminated label: " + line);
        if (!s.labels.emplace(key, value).second)
          throw std::runtime_error("label twice: " + line);
        i = v + 1;
        if (i < line.size() && line[i] == ',')
          ++i;
      }
      if (i >= line.size())
        throw std::runtime_error("unterminated labels: " + line);
      ++i;
    }
    if (i >= line.size() || line[i] != ' ')
      throw std::runtime_error("no value: " + line);
    const std::string value = line.substr(i + 1);
    std::size_t used = 0;
    if (value == "+Inf") {
      s.value = INFINITY;
    } else {
      s.value = std::stod(value, &used);
      if (used != value.size())
        throw std::runtime_error("bad value: " + line);
    }
    std::string family = s.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string suf = suffix;
      if (!typed.count(family) && family.size() > suf.size() &&
          family.compare(family.size() - suf.size(), suf.size(), suf) == 0) {
        family.resize(family.size() - suf.size());
      }
    }
    if (!typed.count(family))
      throw std::runtime_error("sample before its TYPE: " + line);
    out.push_back(std::move(s));
  }
  return out;
}

double value_of(const std::vector<Sample>& samples, const std::string& name,
                const std::map<std::string, std::string>& labels = {}) {
  double total = 0;
  bool found = false;
  for (const auto& s : samples) {
    if (s.name != name)
      continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      match = match && it != s.labels.end() && it->second == v;
    }
    if (match) {
      total += s.value;
      found = true;
    }
  }
  return found ? total : -1;
}

// /metrics parses strictly and its counters match the traffic sent.
TEST(Metrics, ParsesAndCountsMatchTraffic) {
  Sim p1("prefill", {"--error-rate", "1"}), p2("prefill"), d("decode");
  AdminGateway g({"--prefill", p1.hostport(), p2.hostport(), "--decode", d.hostport(),
                  "--eject-after", "1000"});
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat(true)).status, 200);
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(post_json(g.port(), "/v1/completions",
                        {{"model", "sim-model"}, {"prompt", "x"}, {"max_tokens", 2}})
                  .status,
              200);
  EXPECT_EQ(post_json(g.port(), "/v1/chat/completions", {{"model", "sim-model"}}).status, 400);
  // A request is counted when its last write completes, which a client
  // that already read the answer can race on another worker: wait (a
  // bounded time) until all nine are in, then check every series.
  Response res;
  std::vector<Sample> m;
  eventually(
      [&] {
        // With the admin key: the instances' url labels are its holder's.
        res = http_request(g.port(), "GET", "/metrics", "", {{"X-API-Key", kAdminKey}});
        m = parse_prometheus(res.body);
        return value_of(m, "pdgate_request_duration_seconds_count") >= 9;
      },
      std::chrono::seconds(2));
  ASSERT_EQ(res.status, 200);
  EXPECT_NE(res.header("content-type").find("text/plain"), std::string::npos);
  ASSERT_NO_THROW(m = parse_prometheus(res.body)) << res.body;
  EXPECT_EQ(value_of(m, "pdgate_requests_total",
                     {{"route", "/v1/chat/completions"}, {"status", "200"}, {"stage", "decode"}}),
            5);
  EXPECT_EQ(value_of(m, "pdgate_requests_total", {{"route", "/v1/completions"}, {"status", "200"}}),
            3);
  EXPECT_EQ(
      value_of(m, "pdgate_requests_total", {{"route", "/v1/chat/completions"}, {"status", "400"}}),
      1);
  EXPECT_EQ(value_of(m, "pdgate_request_duration_seconds_count"), 9);
  // Summed over the decode instances and stream/whole series: each
  // request that decode answered once.
  EXPECT_EQ(value_of(m, "pdgate_decode_time_to_first_token_seconds_count"), 8);
  EXPECT_EQ(value_of(m, "pdgate_time_to_first_token_seconds_count"), 8);
  // Every prefill p1 answered with 500 was retried on p2 (the bad request
  // got p1's own 400, which is never retried).
  double p1_500s = 0;
  for (const auto& r : p1.requests())
    p1_500s += r.value("status", 0) == 500 ? 1 : 0;
  EXPECT_GT(p1_500s, 0);
  EXPECT_EQ(value_of(m, "pdgate_retries_total", {{"stage", "prefill"}}), p1_500s)
      << p1.requests().dump();
  EXPECT_EQ(value_of(m, "pdgate_instance_state", {{"url", d.url()}, {"state", "active"}}), 1);
  EXPECT_EQ(value_of(m, "pdgate_instance_requests_total", {{"url", d.url()}}), 8);
  EXPECT_GE(value_of(m, "pdgate_policy_errors_total"), 0);
  EXPECT_GE(value_of(m, "pdgate_conversation_cache_misses_total"), 0);
  // Every metric the example Grafana dashboard queries exists.
  std::ifstream dash(source_dir() + "/examples/grafana-dashboard.json");
  ASSERT_TRUE(dash.good());
  std::stringstream text;
  text << dash.rdbuf();
  const std::regex name_re("pdgate_[a-z_]+");
  const std::string dash_text = text.str();
  for (std::sregex_iterator it(dash_text.begin(), dash_text.end(), name_re), end; it != end; ++it) {
    std::string name = it->str();
    // Per-key series exist only with --api-keys, the Redis connections'
    // only with --redis, per-source DNS series only with a dns:// source
    // (this gateway has none); Dashboard.EveryExpressionReturnsData runs
    // with all three.
    if (name.starts_with("pdgate_key_") || name.starts_with("pdgate_redis_") ||
        name.starts_with("pdgate_dns_"))
      continue;
    // Dashboards query {hits,misses,errors} one by one; histograms by _bucket.
    EXPECT_NE(res.body.find(name), std::string::npos) << name;
  }
  // The admin listener serves the same metrics.
  auto admin = http_request(g.admin, "GET", "/metrics");
  EXPECT_EQ(admin.status, 200);
  EXPECT_NO_THROW(parse_prometheus(admin.body));
}

}  // namespace
}  // namespace pdgate::test
