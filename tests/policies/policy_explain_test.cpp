// POST /admin/policy/explain through a real gateway and simulated engines:
// it answers the picks the same request then really gets, and changes
// nothing (no engine contacted, no counter, no key of the shared store,
// no rate window, no rotation moved, no prefix learnt).
#include <gtest/gtest.h>

#include <sstream>

#include "tests/integration/admin_gateway.hpp"
#include "tests/integration/harness.hpp"
#include "tests/policies/policy_gateway_util.hpp"

namespace pdgate::test {
namespace {

// Every primitive that changes state: a rate window per tenant (3 a
// minute), a key set per request, a counter, a log line, prefix lookups
// (which record the route), and rotations kept in the shared store.
constexpr const char* kExplained = R"lua(
return {
  on_request = function(req)
    local tenant = req.headers["x-tenant"] or "anonymous"
    local ok, retry_after = pdgate.rate("explain:" .. tenant, 3, 60)
    if not ok then
      return 429, "tenant " .. tenant .. " is over 3 requests a minute",
             { ["Retry-After"] = retry_after }
    end
    pdgate.kv_set("last:" .. tenant, req.request_id)
    req.vars.tenant = tenant
    pdgate.count("hooked")
    pdgate.log("debug", "tenant " .. tenant)
  end,
  pick = function(ctx, instances)
    if ctx.stage == "prefill" then
      local matches = pdgate.prefix_matches()
      local best, best_blocks = nil, 0
      for i, blocks in pairs(matches) do
        if blocks > best_blocks then best, best_blocks = instances[i], blocks end
      end
      if best then
        pdgate.log("debug", ctx.vars.tenant .. ": prefix home " .. best.url)
        return best
      end
    end
    local turn = pdgate.kv_incr("turn:" .. ctx.stage)
    return instances[turn % #instances + 1]
  end,
}
)lua";

// The /metrics lines a pick, a hook or a routed request moves.
std::string state_lines(std::uint16_t port) {
  std::istringstream in(get(port, "/metrics").body);
  std::string line, out;
  for (const char* prefix :
       {"pdgate_policy_", "pdgate_requests_total", "pdgate_instance_in_flight",
        "pdgate_instance_requests_total", "pdgate_kv_index_", "pdgate_requests_by_path_total"}) {
    in.clear();
    in.seekg(0);
    while (std::getline(in, line)) {
      if (line.rfind(prefix, 0) == 0)
        out += line + "\n";
    }
  }
  return out;
}

// Once `n` requests are counted and none is in flight: what a request
// counts is counted after its client has its answer.
bool settled(std::uint16_t port, int n) {
  std::istringstream in(state_lines(port));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("pdgate_instance_in_flight", 0) == 0 && line.substr(line.size() - 2) != " 0")
      return false;
  }
  return metric(port, R"(pdgate_requests_total{route="/v1/chat/completions",status="200",)"
                      R"(stage="decode"})") == n;
}

// The shared store's keys and values (not their TTLs, which run down).
Json store(AdminGateway& gw) {
  Json j = gw.call("GET", "/admin/policy/kv").json();
  for (auto& k : j["keys"])
    k.erase("ttl_seconds");
  return j["keys"];
}

std::size_t served(Sim& s) {
  return s.requests().size();
}

TEST(PolicyExplain, AnswersThePicksTheRequestThenGetsAndChangesNothing) {
  Sim p1("prefill"), p2("prefill"), d1("decode"), d2("decode");
  Script policy(kExplained, "explained.lua");
  AdminGateway gw({"--model", "sim-model", "--workers", "2", "--policy", policy.path(), "--prefill",
                   p1.hostport(), p2.hostport(), "--decode", d1.hostport(), d2.hostport()});
  std::string prompt;
  while (prompt.size() < 1200)
    prompt += "You are a careful assistant who answers in one short sentence. ";
  const Headers tenant = {{"x-tenant", "acme"}};
  // A first turn teaches the index where this prompt's prefix went.
  ASSERT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat(prompt), tenant).status, 200);
  const Json body = user_chat(prompt + "And then?");
  const Json doc = {{"headers", {{"x-tenant", "acme"}}}, {"body", body}};
  ASSERT_TRUE(eventually([&] { return settled(gw.port(), 1); }));

  const std::string metrics_before = state_lines(gw.port());
  const Json store_before = store(gw);
  const std::size_t before[] = {served(p1), served(p2), served(d1), served(d2)};
  auto r = gw.call("POST", "/admin/policy/explain", doc);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json e = r.json();
  // A second explanation is the same: the first changed nothing it reads.
  Json again = gw.call("POST", "/admin/policy/explain", doc).json();
  EXPECT_EQ(again["stages"], e["stages"]);

  EXPECT_EQ(e["hook"]["outcome"], "accepted") << e;
  EXPECT_EQ(e["hook"]["log"], Json::array({"debug: tenant acme"}));
  EXPECT_EQ(e["hook"]["policy"], "explained");
  const std::string version =
      gw.call("GET", "/admin/config").json()["policies"]["stages"]["decode"]["version"];
  EXPECT_EQ(e["hook"]["version"], version);
  EXPECT_EQ(e["path"], "pd");
  EXPECT_EQ(e["answer"]["routed"], true);
  ASSERT_EQ(e["stages"].size(), 2u) << e;
  const Json& pre = e["stages"][0];
  const Json& dec = e["stages"][1];
  EXPECT_EQ(pre["stage"], "prefill");
  EXPECT_EQ(pre["outcome"], "chosen");
  EXPECT_EQ(pre["version"], version);
  ASSERT_EQ(pre["candidates"].size(), 2u);
  // The prefix's home is the one candidate holding blocks, and the pick.
  const std::string home = pre["pick"]["url"];
  for (const auto& c : pre["candidates"]) {
    EXPECT_TRUE(c.contains("load") && c.contains("in_flight") && c.contains("labels")) << c;
    if (c["url"] == home)
      EXPECT_GE(c["prefix_blocks"].get<int>(), 4) << c;
    else
      EXPECT_EQ(c["prefix_blocks"], 0) << c;
  }
  EXPECT_EQ(pre["log"], Json::array({"debug: acme: prefix home " + home}));
  EXPECT_EQ(dec["stage"], "decode");
  EXPECT_EQ(dec["outcome"], "chosen");
  const std::string decode = dec["pick"]["url"];

  // Nothing moved: no engine asked, no counter, no key, no window.
  EXPECT_EQ(state_lines(gw.port()), metrics_before);
  EXPECT_EQ(store(gw), store_before);
  const std::size_t after[] = {served(p1), served(p2), served(d1), served(d2)};
  EXPECT_TRUE(std::equal(std::begin(before), std::end(before), std::begin(after)));

  // The request itself goes where the explanation said.
  ASSERT_EQ(post_json(gw.port(), "/v1/chat/completions", body, tenant).status, 200);
  EXPECT_EQ(served(home == p1.url() ? p1 : p2), before[home == p1.url() ? 0 : 1] + 1);
  EXPECT_EQ(served(decode == d1.url() ? d1 : d2), before[decode == d1.url() ? 2 : 3] + 1);
  EXPECT_EQ(served(p1) + served(p2), before[0] + before[1] + 1);

  // Two explanations took no place in the window: a third request fits;
  // then the explanation is the refusal the next request gets.
  ASSERT_EQ(post_json(gw.port(), "/v1/chat/completions", body, tenant).status, 200);
  const Json refused = gw.call("POST", "/admin/policy/explain", doc).json();
  EXPECT_EQ(refused["hook"]["outcome"], "rejected") << refused;
  EXPECT_EQ(refused["answer"]["status"], 429);
  EXPECT_EQ(refused["answer"]["reject"], "request:rejected");
  EXPECT_EQ(refused["answer"]["message"], "tenant acme is over 3 requests a minute");
  const int retry_after = std::stoi(refused["answer"]["headers"]["Retry-After"].get<std::string>());
  EXPECT_GE(retry_after, 1);
  EXPECT_LE(retry_after, 60);
  EXPECT_FALSE(refused.contains("stages"));
  auto real = post_json(gw.port(), "/v1/chat/completions", body, tenant);
  EXPECT_EQ(real.status, 429);
  EXPECT_FALSE(real.header("retry-after").empty());
}

// The document is checked like any admin call: bad ones get 400 with
// the reason, and the endpoint needs the admin key.
TEST(PolicyExplain, RefusesBadDocuments) {
  Sim d("both", {"--itl-ms", "0"});
  AdminGateway gw({"--model", "sim-model", "--workers", "1", "--kv-connector", "none", "--decode",
                   d.hostport()});
  const auto message = [](const Response& r) {
    return r.json()["error"]["message"].get<std::string>();
  };
  auto r = http_request(gw.admin, "POST", "/admin/policy/explain", "{not json",
                        {{"X-API-Key", kAdminKey}, {"Content-Type", "application/json"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(message(r).find("not valid JSON"), std::string::npos) << r.body;
  r = gw.call("POST", "/admin/policy/explain", {{"headers", Json::object()}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(message(r).find("body"), std::string::npos) << r.body;
  r = gw.call("POST", "/admin/policy/explain",
              {{"headers", Json::array()}, {"body", user_chat("x")}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(message(r).find("headers must be an object"), std::string::npos) << r.body;
  r = gw.call("POST", "/admin/policy/explain",
              {{"headers", {{"bad name", "x"}}}, {"body", user_chat("x")}});
  EXPECT_EQ(r.status, 400);
  r = gw.call("POST", "/admin/policy/explain",
              {{"headers", {{"x-a", "1\r\nx-b: 2"}}}, {"body", user_chat("x")}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(message(r).find("control character"), std::string::npos) << r.body;
  r = gw.call("POST", "/admin/policy/explain", {{"path", "/v1/other"}, {"body", user_chat("x")}});
  EXPECT_EQ(r.status, 400);
  // A body the gateway would refuse: the same reason.
  r = gw.call("POST", "/admin/policy/explain", {{"body", {{"model", 5}}}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(message(r).find("'model' must be a string"), std::string::npos) << r.body;
  EXPECT_EQ(gw.call("POST", "/admin/policy/explain", {{"body", user_chat("x")}}, {}).status, 401);
  // A good one: the shipped round_robin, natively, with its rotation.
  r = gw.call("POST", "/admin/policy/explain", {{"body", user_chat("x")}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["hook"]["ran"], false);
  EXPECT_EQ(r.json()["path"], "one_hop");
  EXPECT_EQ(r.json()["stages"][0]["policy"], "round_robin");
  EXPECT_EQ(r.json()["stages"][0]["pick"]["url"], d.url());
  EXPECT_TRUE(d.requests().empty());
}

}  // namespace
}  // namespace pdgate::test
