// Policy API v2 through a real gateway in front of pdgate-sim engines: the
// request hook (reject, header and body edits, the path), per-request one
// hop with each KV connector, fail-closed policies, pdgate.log and
// pdgate.count, and docs/policies.md's worked example run as it is written
// in examples/tenants/.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/integration/harness.hpp"
#include "tests/policies/policy_gateway_util.hpp"

namespace pdgate::test {
namespace {

// The body the engine received, parsed.
Json body_of(const Json& record) {
  return Json::parse(record.at("body").get<std::string>());
}

std::string example(const std::string& file) {
  return source_dir() + "/examples/tenants/" + file;
}

// --- docs/policies.md's worked example, as written --------------------------------

// The tenant split of examples/tenants/ (policy, keys and YAML as checked
// in; only the YAML's engine addresses become the sims'): gold keys reach
// only the gold decode, standard keys only the standard ones (capped,
// prioritised, tagged), a key without a tier gets 429 and no engine sees
// it, and with the standard instances gone a standard request gets 503
// (fail-closed) instead of landing on the gold one.
TEST(PolicyV2, TenantSplitExampleAsDocumented) {
  Sim prefill("prefill"), gold("decode", {"--itl-ms", "0"}), std1("decode", {"--itl-ms", "0"});
  auto std2 = std::make_unique<Sim>("decode", std::vector<std::string>{"--itl-ms", "0"});
  std::string yaml = read_text(example("pdgate.yaml"));
  ASSERT_FALSE(yaml.empty());
  // docs/policies.md shows the files as they are here.
  const std::string doc = read_text(source_dir() + "/docs/policies.md");
  for (const char* f : {"tenant_split.lua", "pdgate.yaml", "keys.yaml"})
    EXPECT_NE(doc.find(read_text(example(f))), std::string::npos) << f << " differs in the docs";
  const std::pair<const char*, std::string> ports[] = {{"127.0.0.1:8100", prefill.hostport()},
                                                       {"127.0.0.1:8200", gold.hostport()},
                                                       {"127.0.0.1:8201", std1.hostport()},
                                                       {"127.0.0.1:8202", std2->hostport()}};
  for (const auto& [from, to] : ports) {
    const auto at = yaml.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    yaml.replace(at, std::string(from).size(), to);
  }
  EditedFile config("pdgate.yaml", yaml);
  Gateway gw({"--config", config.path(), "--policy", example("tenant_split.lua"), "--api-keys",
              example("keys.yaml"), "--workers", "2", "--health-interval", "200ms"});

  for (int i = 0; i < 6; ++i) {
    auto r = post_json(gw.port(), "/v1/chat/completions",
                       user_chat("gold " + std::to_string(i), 2000), with_key("gold-tenant-key"));
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(gold.requests().size(), 6u);
  EXPECT_EQ(std1.requests().size() + std2->requests().size(), 0u);
  for (const auto& rec : gold.requests()) {
    EXPECT_EQ(rec["headers"].value("x-tenant-tier", ""), "gold");
    EXPECT_EQ(body_of(rec)["max_tokens"], 2000);  // gold is not capped
    EXPECT_FALSE(body_of(rec).contains("priority"));
  }

  for (int i = 0; i < 6; ++i) {
    auto r =
        post_json(gw.port(), "/v1/chat/completions", user_chat("std " + std::to_string(i), 2000),
                  with_key("standard-tenant-key"));
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(gold.requests().size(), 6u);
  const Json s1 = std1.requests(), s2 = std2->requests();
  EXPECT_EQ(s1.size() + s2.size(), 6u);
  EXPECT_GT(s1.size(), 0u);
  EXPECT_GT(s2.size(), 0u);
  for (const Json* recs : {&s1, &s2}) {
    for (const auto& rec : *recs) {
      EXPECT_EQ(rec["headers"].value("x-tenant-tier", ""), "standard");
      EXPECT_EQ(body_of(rec)["max_tokens"], 512);
      EXPECT_EQ(body_of(rec)["priority"], 10);
      EXPECT_EQ(rec["completion_tokens"], 512);
    }
  }

  // A key without a tier: 429 in OpenAI's shape, before any engine.
  const auto before = prefill.requests().size();
  auto r = post_json(gw.port(), "/v1/chat/completions", user_chat("who"), with_key("no-tier-key"));
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.json()["error"]["message"], "this API key belongs to no tenant tier");
  EXPECT_EQ(r.json()["error"]["type"], "RateLimitError");
  EXPECT_EQ(prefill.requests().size(), before);
  // No key at all: the key check's 401 comes first.
  EXPECT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat("anon")).status, 401);

  EXPECT_EQ(metric(gw.port(),
                   "pdgate_policy_custom_total{policy=\"tenant_split\",name=\"unknown_"
                   "tenant\"}"),
            1);
  EXPECT_EQ(
      metric(gw.port(), "pdgate_policy_custom_total{policy=\"tenant_split\",name=\"tier_gold\"}"),
      6);
  EXPECT_EQ(metric(gw.port(),
                   "pdgate_policy_calls_total{policy=\"tenant_split\",stage=\"request\","
                   "outcome=\"rejected\"}"),
            1);

  // The standard tier's engines go away: 503, and gold never sees them.
  std1.process().signal(SIGKILL);
  std2.reset();
  ASSERT_TRUE(eventually(
      [&] {
        auto a = post_json(gw.port(), "/v1/chat/completions", user_chat("late"),
                           with_key("standard-tenant-key"));
        return a.status == 503;
      },
      std::chrono::seconds(20)));
  auto late = post_json(gw.port(), "/v1/chat/completions", user_chat("late again"),
                        with_key("standard-tenant-key"));
  EXPECT_EQ(late.status, 503) << late.body;
  EXPECT_EQ(gold.requests().size(), 6u);
  // Gold still served.
  EXPECT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat("gold again"),
                      with_key("gold-tenant-key"))
                .status,
            200);
}

// --- The request hook ------------------------------------------------------------

constexpr const char* kEditingHook = R"lua(
return {
  on_request = function(req)
    if req.body.user == "blocked" then return 403, "user " .. req.body.user .. " is blocked" end
    if (req.message_count or 0) > 3 then return 413, "at most 3 messages" end
    if req.headers["x-mode"] == "bad-header" then req:set_header("Connection", "close") end
    req:set_header("X-Team", "t-" .. req.model)
    req:remove_header("x-configured")
    req:cap_max_tokens(req.body.max_tokens > 5 and 5 or req.body.max_tokens)
    req:set_priority(-3)
  end,
  pick = function(ctx, instances) return pdgate.least_loaded() end,
}
)lua";

// The hook reads body fields and headers and rejects with its own status
// and message (403, 413 in OpenAI's error shape, no engine reached); else
// the engines receive its header edits (set, a configured header removed)
// and field edits (max_tokens capped to 5, priority -3) in both stages'
// bodies, and answer 5 tokens.
TEST(PolicyV2, RequestHookRejectsAndEdits) {
  Sim p("prefill"), d("decode", {"--itl-ms", "0"});
  Script f(kEditingHook);
  Gateway gw({"--model", "sim-model", "--workers", "1", "--policy", f.path(), "--set-header",
              "X-Configured: yes", "--prefill", p.hostport(), "--decode", d.hostport()});
  Json blocked = user_chat("hi");
  blocked["user"] = "blocked";
  auto r = post_json(gw.port(), "/v1/chat/completions", blocked);
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.json()["error"]["message"], "user blocked is blocked");
  Json many = user_chat("hi");
  for (int i = 0; i < 3; ++i)
    many["messages"].push_back({{"role", "user"}, {"content", "more"}});
  EXPECT_EQ(post_json(gw.port(), "/v1/chat/completions", many).status, 413);
  EXPECT_EQ(p.requests().size() + d.requests().size(), 0u);

  r = post_json(gw.port(), "/v1/chat/completions", user_chat("edit me", 40));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["usage"]["completion_tokens"], 5);
  for (Sim* s : {&p, &d}) {
    const Json recs = s->requests();
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0]["headers"].value("x-team", ""), "t-sim-model");
    EXPECT_FALSE(recs[0]["headers"].contains("x-configured"));
    EXPECT_EQ(body_of(recs[0])["priority"], -3);
  }
  EXPECT_EQ(body_of(d.requests()[0])["max_tokens"], 5);

  // A refused edit (a hop-by-hop header) is the hook's error: the request
  // goes on as configured, unedited, and the error is counted.
  d.clear();
  r = post_json(gw.port(), "/v1/chat/completions", user_chat("bad", 40),
                {{"x-mode", "bad-header"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(body_of(d.requests()[0])["max_tokens"], 40);
  EXPECT_TRUE(d.requests()[0]["headers"].contains("x-configured"));
  EXPECT_EQ(
      metric(gw.port(),
             "pdgate_policy_calls_total{policy=\"hook\",stage=\"request\",outcome=\"error\"}"),
      1);
}

// req:cap_max_tokens holds for every way a client can write the number,
// read as vLLM reads it (issue 32, item 6): 100.0, 1e2 and "100" are 100
// and get capped, in max_tokens and in a chat's max_completion_tokens;
// a fraction, a negative count or a value past int64 is refused with 400
// before any engine sees it.
TEST(PolicyV2, MaxTokensCapHoldsForEveryNumberForm) {
  Sim p("prefill"), d("decode", {"--itl-ms", "0"});
  Script f(R"lua(
return {
  on_request = function(req) req:cap_max_tokens(16) end,
  pick = function(ctx, instances) return pdgate.least_loaded() end,
}
)lua");
  Gateway gw({"--model", "sim-model", "--workers", "1", "--policy", f.path(), "--prefill",
              p.hostport(), "--decode", d.hostport()});
  const std::string head = R"({"model":"sim-model","messages":[{"role":"user","content":"hi"}],)";
  const Headers json = {{"Content-Type", "application/json"}};
  for (const std::string field :
       {R"("max_tokens":100.0)", R"("max_tokens":1e2)", R"("max_tokens":1.0E+2)",
        R"("max_tokens":"100")", R"("max_completion_tokens":5e2)",
        R"("max_tokens":12,"max_completion_tokens":500.0)"}) {
    d.clear();
    const auto r =
        http_request(gw.port(), "POST", "/v1/chat/completions", head + field + "}", json);
    ASSERT_EQ(r.status, 200) << field << ": " << r.body;
    EXPECT_LE(r.json()["usage"]["completion_tokens"].get<int>(), 16) << field;
    const Json sent = body_of(d.requests().at(0));
    for (const char* key : {"max_tokens", "max_completion_tokens"}) {
      if (sent.contains(key)) {
        EXPECT_LE(sent[key].get<double>(), 16) << field << " sent " << sent.dump();
      }
    }
  }
  p.clear();
  d.clear();
  for (const std::string field :
       {R"("max_tokens":100.5)", R"("max_tokens":-1)", R"("max_tokens":99999999999999999999)",
        R"("max_tokens":1e30)", R"("max_completion_tokens":"lots")", R"("max_tokens":true)"}) {
    const auto r =
        http_request(gw.port(), "POST", "/v1/chat/completions", head + field + "}", json);
    EXPECT_EQ(r.status, 400) << field << ": " << r.body;
    if (r.status == 400) {
      EXPECT_EQ(r.json()["error"]["type"], "BadRequestError") << r.body;
    }
  }
  EXPECT_EQ(p.requests().size() + d.requests().size(), 0u);
}

// A hook that loops forever, allocates without bound, raises, or returns
// garbage is cut off within its budget or memory cap: the request goes on
// as configured (200) unless the policy is fail-closed (503, source
// policy), each failure counted by outcome, and the gateway keeps serving.
TEST(PolicyV2, BrokenHooksAreContained) {
  Sim d("both", {"--itl-ms", "0"});
  for (const bool closed : {false, true}) {
    Script f(std::string("return { fail_closed = ") + (closed ? "true" : "false") + R"lua(,
  on_request = function(req)
    local mode = req.headers["x-mode"]
    if mode == "loop" then while true do end end
    if mode == "alloc" then
      local t = {}
      while true do t[#t + 1] = string.rep("x", 65536) .. #t end
    end
    if mode == "error" then error("broken on purpose") end
    if mode == "garbage" then return "yes" end
    if mode == "status" then return 200, "not an error status" end
    if mode == "os" then os.exit(1) end
  end,
  pick = function(ctx, instances) return 1 end,
}
)lua");
    Gateway gw({"--model", "sim-model", "--workers", "1", "--kv-connector", "none", "--policy",
                f.path(), "--policy-memory", "16MiB", "--decode", d.hostport()});
    for (const char* mode : {"loop", "alloc", "error", "garbage", "status", "os"}) {
      const auto t0 = Clock::now();
      auto r = post_json(gw.port(), "/v1/chat/completions", user_chat("x"), {{"x-mode", mode}});
      EXPECT_EQ(r.status, closed ? 503 : 200) << mode << ": " << r.body;
      EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5)) << mode;
      if (closed) {
        EXPECT_EQ(r.json()["error"]["message"], "the request policy failed") << mode;
      }
    }
    EXPECT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat("fine")).status, 200);
    const std::string calls =
        "pdgate_policy_calls_total{policy=\"hook\",stage=\"request\",outcome=";
    EXPECT_GE(metric(gw.port(), calls + "\"budget\"}"), 1);
    EXPECT_GE(metric(gw.port(), calls + "\"error\"}") + metric(gw.port(), calls + "\"budget\"}"),
              6);
    EXPECT_EQ(metric(gw.port(), calls + "\"accepted\"}"), 1);
    EXPECT_TRUE(gw.process().running());
  }
}

// A fail-closed pick that errors answers 503 from the policy instead of
// round-robin; the same script without fail_closed falls back (200).
TEST(PolicyV2, FailClosedPick) {
  Sim d1("both", {"--itl-ms", "0"}), d2("both", {"--itl-ms", "0"});
  for (const bool closed : {false, true}) {
    Script f(std::string("return { fail_closed = ") + (closed ? "true" : "false") + R"lua(,
  pick = function(ctx, instances)
    if ctx.headers["x-mode"] == "error" then error("no rule for this") end
    if ctx.headers["x-mode"] == "none" then return nil end
    return 1
  end,
}
)lua");
    Gateway gw({"--model", "sim-model", "--workers", "1", "--kv-connector", "none", "--policy",
                f.path(), "--decode", d1.hostport(), d2.hostport()});
    for (const char* mode : {"error", "none"}) {
      auto r = post_json(gw.port(), "/v1/chat/completions", user_chat("x"), {{"x-mode", mode}});
      EXPECT_EQ(r.status, closed ? 503 : 200) << mode << ": " << r.body;
      if (closed) {
        EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("fail-closed"),
                  std::string::npos);
      }
    }
    EXPECT_EQ(
        metric(gw.port(),
               "pdgate_policy_calls_total{policy=\"hook\",stage=\"decode\",outcome=\"error\"}"),
        1);
    EXPECT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat("fine")).status, 200);
  }
}

// pdgate.log is rate-limited per policy (drops counted), pdgate.count keeps
// at most 32 names per policy (the rest refused and counted), and invalid
// names are refused with nil, err.
TEST(PolicyV2, LogAndCountAreBounded) {
  Sim d("both", {"--itl-ms", "0"});
  Script f(R"lua(
return {
  on_request = function(req)
    for i = 1, 50 do pdgate.log("info", "line " .. i .. "\nforged") end
    for i = 1, 40 do pdgate.count("c" .. i) end
    local ok, err = pdgate.count("bad name!")
    if ok or not err then error("a bad name was accepted") end
    pdgate.count("requests", 2)
  end,
  pick = function(ctx, instances) return 1 end,
}
)lua");
  Gateway gw({"--model", "sim-model", "--workers", "1", "--kv-connector", "none", "--policy",
              f.path(), "--decode", d.hostport()});
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat("x")).status, 200);
  // 150 lines against a burst of 20 refilled at 10/s: even 9 s of slow
  // (sanitized) requests leave 40 dropped.
  EXPECT_GE(metric(gw.port(), "pdgate_policy_log_dropped_total{policy=\"hook\",kind=\"log\"}"), 40);
  EXPECT_EQ(metric(gw.port(), "pdgate_policy_custom_total{policy=\"hook\",name=\"c1\"}"), 3);
  EXPECT_EQ(metric(gw.port(), "pdgate_policy_custom_total{policy=\"hook\",name=\"c32\"}"), 3);
  // c1..c32 fill the 32 names: c33..c40 and "requests" are refused.
  EXPECT_EQ(metric(gw.port(), "pdgate_policy_custom_total{policy=\"hook\",name=\"c33\"}"), -1);
  EXPECT_EQ(metric(gw.port(), "pdgate_policy_custom_total{policy=\"hook\",name=\"requests\"}"), -1);
  EXPECT_GE(metric(gw.port(), "pdgate_policy_log_dropped_total{policy=\"hook\",kind=\"counter\"}"),
            27);
  // Log lines stay one line each: the newline became a space.
  const std::string log = gw.process().log();
  EXPECT_NE(log.find("policy hook: line 1 forged"), std::string::npos);
}

// Editing the hook in a running gateway takes effect without a restart.
TEST(PolicyV2, HookReloads) {
  Sim d("both", {"--itl-ms", "0"});
  Script f(R"lua(return { on_request = function(req) return 418, "teapot" end,
                          pick = function(ctx, instances) return 1 end })lua");
  Gateway gw({"--model", "sim-model", "--workers", "2", "--kv-connector", "none", "--policy",
              f.path(), "--policy-poll-interval", "100ms", "--decode", d.hostport()});
  EXPECT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat("x")).status, 418);
  f.write(R"lua(return { on_request = function(req) end,
                         pick = function(ctx, instances) return 1 end })lua");
  EXPECT_TRUE(eventually(
      [&] { return post_json(gw.port(), "/v1/chat/completions", user_chat("x")).status == 200; }));
}

// --- Per-request one hop --------------------------------------------------------------

// conditional_pd with each connector: a short prompt goes one hop (the
// prefill engine never sees it; decode gets no kv_transfer_params and
// prefills it itself), a long one goes prefill then decode, and
// pdgate_requests_by_path_total counts both. p2p-nccl keeps every request
// on P/D (its decode engines need a prefill peer); none is always one hop.
TEST(PolicyV2, ConditionalPdPerConnector) {
  const std::string long_prompt(4000, 'l');
  for (const std::string connector : {"nixl", "lmcache", "p2p-nccl", "none"}) {
    SCOPED_TRACE(connector);
    const bool has_prefill = connector != "none";
    const std::vector<std::string> sim_args = {"--kv-connector", connector, "--itl-ms", "0"};
    Sim p(has_prefill ? "prefill" : "both", sim_args), d(has_prefill ? "decode" : "both", sim_args);
    // p2p-nccl names each engine's ZMQ address; the sims only check that
    // the request id names two.
    const std::string p_peer = connector == "p2p-nccl" ? "@10.0.0.1:21001" : "";
    const std::string d_peer = connector == "p2p-nccl" ? "@10.0.0.2:22001" : "";
    std::vector<std::string> args = {"--model",  "sim-model",      "--workers",      "1",
                                     "--policy", "conditional_pd", "--kv-connector", connector};
    if (has_prefill)
      args.insert(args.end(), {"--prefill", p.hostport() + p_peer});
    args.insert(args.end(), {"--decode", d.hostport() + d_peer});
    Gateway gw(args);
    auto r = post_json(gw.port(), "/v1/chat/completions", user_chat("short"));
    ASSERT_EQ(r.status, 200) << r.body;
    r = post_json(gw.port(), "/v1/chat/completions", user_chat(long_prompt));
    ASSERT_EQ(r.status, 200) << r.body;
    const Json dec = d.requests();
    ASSERT_EQ(dec.size(), 2u);
    if (connector == "p2p-nccl") {
      EXPECT_EQ(p.requests().size(), 2u);
      EXPECT_EQ(metric(gw.port(), "pdgate_requests_by_path_total{path=\"pd\"}"), 2);
    } else if (has_prefill) {
      // Only the long prompt reached the prefill engine.
      ASSERT_EQ(p.requests().size(), 1u);
      EXPECT_GT(p.requests()[0]["prompt_tokens"].get<int>(), 500);
      // The short one reached decode without params and was prefilled there.
      EXPECT_FALSE(body_of(dec[0]).contains("kv_transfer_params"));
      EXPECT_EQ(dec[0]["kv_result"], "none");
      EXPECT_EQ(metric(gw.port(), "pdgate_requests_by_path_total{path=\"one_hop\"}"), 1);
      EXPECT_EQ(metric(gw.port(), "pdgate_requests_by_path_total{path=\"pd\"}"), 1);
    } else {
      EXPECT_EQ(metric(gw.port(), "pdgate_requests_by_path_total{path=\"one_hop\"}"), 2);
    }
  }
}

// conditional_pd sends a long prompt one hop once the decode instance it
// went to holds it: the second time, the prefill engine is skipped and the
// decode engine serves the prompt from its own prefix cache.
TEST(PolicyV2, ConditionalPdFollowsTheDecodeCache) {
  Sim p("prefill"), d("decode", {"--itl-ms", "0"});
  Gateway gw({"--model", "sim-model", "--workers", "1", "--policy", "conditional_pd", "--prefill",
              p.hostport(), "--decode", d.hostport()});
  const std::string prompt(4000, 'q');
  ASSERT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat(prompt)).status, 200);
  ASSERT_EQ(p.requests().size(), 1u);
  ASSERT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat(prompt)).status, 200);
  EXPECT_EQ(p.requests().size(), 1u);
  const Json dec = d.requests();
  ASSERT_EQ(dec.size(), 2u);
  EXPECT_FALSE(body_of(dec[1]).contains("kv_transfer_params"));
  EXPECT_GT(dec[1]["cached_tokens"].get<int>(), dec[1]["prompt_tokens"].get<int>() / 2);
}

// A decode engine given a request one hop prefills it itself, as vLLM
// does: the prefill's time shows before its first token, and the same
// prompt again is served from its prefix cache, faster.
TEST(PolicyV2, OneHopDecodePrefillsLocally) {
  Sim p("prefill"), d("decode", {"--itl-ms", "0", "--prefill-us-per-token", "2000"});
  Gateway gw({"--model", "sim-model", "--workers", "1", "--policy", "conditional_pd", "--prefill",
              p.hostport(), "--decode", d.hostport()});
  // Under conditional_pd's 256 estimated tokens: one hop.
  std::string prompt;
  for (int i = 0; prompt.size() < 900; ++i)
    prompt += "word" + std::to_string(i) + " ";
  const auto ttft_ms = [&](std::size_t i) {
    const Json r = d.requests()[i];
    return r["ended_at_ms"].get<std::int64_t>() - r["received_at_ms"].get<std::int64_t>();
  };
  ASSERT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat(prompt, 1)).status, 200);
  ASSERT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat(prompt, 1)).status, 200);
  EXPECT_EQ(p.requests().size(), 0u);
  const Json first = d.requests()[0], second = d.requests()[1];
  const auto tokens = first["prompt_tokens"].get<std::int64_t>();
  ASSERT_GT(tokens, 100);
  EXPECT_EQ(first["cached_tokens"], 0);
  // 2 ms per uncached token (one output token: the whole answer is the prefill).
  EXPECT_GE(ttft_ms(0), tokens * 2);
  EXPECT_GT(second["cached_tokens"].get<std::int64_t>(), tokens / 2);
  EXPECT_LT(ttft_ms(1), ttft_ms(0));
}

}  // namespace
}  // namespace pdgate::test
