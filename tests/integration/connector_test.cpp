// Each --kv-connector mode's exact upstream requests, through pdgate to
// pdgate-sim prefill and decode instances.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <thread>

#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

Json kv_chat(bool stream) {
  return {{"model", "sim-model"},
          {"messages", {{{"role", "user"}, {"content", "Tell me about KV connectors."}}}},
          {"max_tokens", 4},
          {"min_tokens", 2},
          {"stream", stream}};
}

// lmcache: prefill gets max_tokens 1 and no params, its answer is dropped;
// decode gets the client's body without params. Streaming and not.
TEST(Connectors, LmCacheSendsNoParams) {
  Sim p("prefill", {"--kv-connector", "lmcache"}), d("decode", {"--kv-connector", "lmcache"});
  Gateway gw({"--kv-connector", "lmcache", "--prefill", p.hostport(), "--decode", d.hostport()});
  for (bool stream : {false, true}) {
    p.clear();
    d.clear();
    const Json body = kv_chat(stream);
    auto r = post_json(gw.port(), "/v1/chat/completions", body, {{"X-Request-Id", "lm-1"}});
    ASSERT_EQ(r.status, 200) << r.body;
    auto pre = p.requests();
    auto dec = d.requests();
    ASSERT_EQ(pre.size(), 1u);
    ASSERT_EQ(dec.size(), 1u);
    Json pb = Json::parse(pre[0]["body"].get<std::string>());
    EXPECT_EQ(pb["max_tokens"], 1);
    EXPECT_EQ(pb["stream"], false);
    EXPECT_FALSE(pb.contains("min_tokens"));
    EXPECT_FALSE(pb.contains("kv_transfer_params"));
    EXPECT_EQ(pb["messages"], body["messages"]);
    EXPECT_EQ(Json::parse(dec[0]["body"].get<std::string>()), body);
    EXPECT_EQ(pre[0]["x_request_id"], "lm-1");
    EXPECT_EQ(dec[0]["x_request_id"], "lm-1");
    EXPECT_EQ(dec[0]["kv_result"], "none");
  }
}

// pdgate-sim's connector switch refuses what a real engine of that
// connector would not get: params under lmcache, a plain id under p2p-nccl.
TEST(Connectors, SimConnectorSwitchChecksRequests) {
  Sim lm("decode", {"--kv-connector", "lmcache"}), p2p("prefill", {"--kv-connector", "p2p-nccl"});
  Json body = kv_chat(false);
  body["kv_transfer_params"] = {{"do_remote_prefill", true}};
  EXPECT_EQ(post_json(lm.port(), "/v1/chat/completions", body).status, 400);
  EXPECT_EQ(
      post_json(p2p.port(), "/v1/chat/completions", kv_chat(false), {{"X-Request-Id", "plain"}})
          .status,
      400);
}

// p2p-nccl: both stages carry the same request id naming the chosen
// prefill's and decode's ZMQ addresses; no params travel.
TEST(Connectors, P2pNcclNamesBothPeers) {
  const std::vector<std::string> p2p = {"--kv-connector", "p2p-nccl"};
  Sim p("prefill", p2p), d1("decode", p2p), d2("decode", p2p);
  Gateway gw({"--kv-connector", "p2p-nccl", "--prefill", p.hostport() + "@10.0.0.1:21001",
              "--decode", d1.hostport() + "@10.0.0.2:22001", d2.hostport() + "@10.0.0.3:22002"});
  for (bool stream : {false, true}) {
    for (int i = 0; i < 2; ++i) {
      for (auto* s : {&p, &d1, &d2})
        s->clear();
      const Json body = kv_chat(stream);
      auto r = post_json(gw.port(), "/v1/chat/completions", body);
      ASSERT_EQ(r.status, 200) << r.body;
      auto pre = p.requests();
      ASSERT_EQ(pre.size(), 1u);
      Json dec = d1.requests();
      std::string zmq = "10.0.0.2:22001";
      if (dec.empty()) {
        dec = d2.requests();
        zmq = "10.0.0.3:22002";
      }
      ASSERT_EQ(dec.size(), 1u);
      const std::string id = pre[0]["x_request_id"];
      EXPECT_TRUE(std::regex_match(
          id, std::regex("___prefill_addr_10\\.0\\.0\\.1:21001___decode_addr_" +
                         std::regex_replace(zmq, std::regex("\\."), "\\.") + "_[0-9a-f]{32}")))
          << id;
      EXPECT_EQ(dec[0]["x_request_id"], id);
      Json pb = Json::parse(pre[0]["body"].get<std::string>());
      EXPECT_EQ(pb["max_tokens"], 1);
      EXPECT_FALSE(pb.contains("kv_transfer_params"));
      EXPECT_EQ(Json::parse(dec[0]["body"].get<std::string>()), body);
    }
  }
}

// p2p-nccl with an instance lacking its ZMQ address: a clear 503 naming
// the form to use, nothing sent to the engines.
TEST(Connectors, P2pNcclNeedsZmqAddresses) {
  Sim p("prefill"), d("decode");
  Gateway gw({"--kv-connector", "p2p-nccl", "--prefill", p.hostport(), "--decode",
              d.hostport() + "@127.0.0.1:22001"});
  auto r = post_json(gw.port(), "/v1/chat/completions", kv_chat(false));
  ASSERT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("@zmqhost:zmqport"), std::string::npos) << r.body;
  EXPECT_TRUE(p.requests().empty());
  EXPECT_TRUE(d.requests().empty());
}

// none: one hop, the client's body untouched, no prefill traffic.
TEST(Connectors, NoneIsOneHop) {
  Sim p("prefill"), pd("both");
  Gateway gw({"--kv-connector", "none", "--prefill", p.hostport(), "--decode", pd.hostport()});
  const Json body = kv_chat(false);
  auto r = post_json(gw.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(p.requests().empty());
  auto seen = pd.requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(Json::parse(seen[0]["body"].get<std::string>()), body);
}

Json kv_of(const Json& rec) {
  return Json::parse(rec["body"].get<std::string>())["kv_transfer_params"];
}

// NIXL push (vLLM's NixlPushConnector, toy_push_proxy_server.py): prefill
// answers transfer_mode "push"; decode gets prefill's coordinates and no
// remote_block_ids, registers with prefill and receives the blocks.
// Streaming and not.
TEST(Connectors, NixlPushSendsCoordinatesWithoutBlockIds) {
  const std::vector<std::string> push = {"--kv-transfer-mode", "push"};
  Sim p("prefill", {"--kv-transfer-mode", "push", "--engine-id", "eng-push"}), d("decode", push);
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  for (bool stream : {false, true}) {
    p.clear();
    d.clear();
    auto r = post_json(gw.port(), "/v1/chat/completions", kv_chat(stream));
    ASSERT_EQ(r.status, 200) << r.body;
    auto pre = p.requests();
    auto dec = d.requests();
    ASSERT_EQ(pre.size(), 1u);
    ASSERT_EQ(dec.size(), 1u);
    EXPECT_EQ(kv_of(pre[0])["do_remote_decode"], true);
    Json kv = kv_of(dec[0]);
    ASSERT_TRUE(kv.is_object()) << dec[0]["body"];
    EXPECT_FALSE(kv.contains("remote_block_ids")) << kv;
    EXPECT_FALSE(kv.contains("transfer_mode")) << kv;
    EXPECT_EQ(kv["do_remote_prefill"], true);
    EXPECT_EQ(kv["do_remote_decode"], false);
    EXPECT_EQ(kv["remote_engine_id"], "eng-push");
    EXPECT_EQ(kv["remote_host"], "127.0.0.1");
    EXPECT_EQ(kv["remote_port"], p.port());
    EXPECT_EQ(kv["tp_size"], 1);
    EXPECT_TRUE(kv["remote_request_id"].is_string());
    EXPECT_EQ(kv.size(), 7u) << kv;
    EXPECT_EQ(dec[0]["kv_result"], "valid");
  }
}

// --nixl-transfer-mode forces the form whatever prefill answers: push to a
// pull-answering prefill drops the block ids; pull to a push-answering one
// relays its object unchanged.
TEST(Connectors, NixlTransferModeFlagForcesTheForm) {
  Sim p_pull("prefill"), d_push("decode", {"--kv-transfer-mode", "push"});
  Gateway forced_push({"--nixl-transfer-mode", "push", "--prefill", p_pull.hostport(), "--decode",
                       d_push.hostport()});
  auto r = post_json(forced_push.port(), "/v1/completions",
                     {{"model", "sim-model"}, {"prompt", "forced push"}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  auto dec = d_push.requests();
  ASSERT_EQ(dec.size(), 1u);
  EXPECT_FALSE(kv_of(dec[0]).contains("remote_block_ids"));
  EXPECT_EQ(dec[0]["kv_result"], "valid");

  Sim p_push("prefill", {"--kv-transfer-mode", "push"}), d_pull("decode");
  Gateway forced_pull({"--nixl-transfer-mode", "pull", "--prefill", p_push.hostport(), "--decode",
                       d_pull.hostport()});
  r = post_json(forced_pull.port(), "/v1/completions",
                {{"model", "sim-model"}, {"prompt", "forced pull"}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  dec = d_pull.requests();
  ASSERT_EQ(dec.size(), 1u);
  EXPECT_TRUE(kv_of(dec[0]).contains("remote_block_ids"));
  EXPECT_EQ(kv_of(dec[0])["transfer_mode"], "push");
  EXPECT_EQ(dec[0]["kv_result"], "valid");
}

// A push answer without a coordinate decode needs: pdgate answers a clear
// 502 naming the field and never sends decode a request vLLM would fail.
// A push decode that gets such params (a gateway relaying them as they
// are) fails the request with 500 naming the field, which pdgate surfaces
// as a 502 from the decode stage.
TEST(Connectors, NixlPushIncompleteParamsAreAClearError) {
  const std::vector<std::string> push = {"--kv-transfer-mode", "push"};
  Sim p("prefill", {"--kv-transfer-mode", "push", "--kv-params-drop", "tp_size"}),
      d("decode", push);
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  auto r = post_json(gw.port(), "/v1/chat/completions", kv_chat(false));
  ASSERT_EQ(r.status, 502) << r.body;
  EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("tp_size"), std::string::npos)
      << r.body;
  EXPECT_EQ(p.requests().size(), 1u);
  EXPECT_TRUE(d.requests().empty());

  // The decode's own check, as a relaying gateway would meet it.
  Gateway relaying(
      {"--nixl-transfer-mode", "pull", "--prefill", p.hostport(), "--decode", d.hostport()});
  r = post_json(relaying.port(), "/v1/chat/completions", kv_chat(false));
  ASSERT_EQ(r.status, 502) << r.body;
  EXPECT_EQ(r.json()["error"]["message"], "decode stage failed: the engine answered 500") << r.body;
  Json body = kv_chat(false);
  body["kv_transfer_params"] = {{"do_remote_prefill", true}, {"remote_engine_id", "e"},
                                {"remote_request_id", "r"},  {"remote_host", "127.0.0.1"},
                                {"remote_port", "80"},       {"tp_size", 1}};
  r = post_json(d.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 500) << r.body;
  EXPECT_NE(r.body.find("remote_port"), std::string::npos) << r.body;
}

// The value of /metrics' first sample line starting with `series`; -1 when none.
double connector_metric(std::uint16_t port, const std::string& series) {
  std::istringstream in(get(port, "/metrics").body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(series + " ") || line.starts_with(series + "{"))
      return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

std::vector<std::string> mooncake_sim(std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"--kv-connector", "mooncake"});
  return extra;
}

// Mooncake (vLLM's mooncake_connector.py): both legs at once under one
// gateway-minted transfer id; decode names prefill's bootstrap server and
// the engine id it answered, and takes the KV without waiting for
// prefill's answer. Streaming and not.
TEST(Connectors, MooncakeSendsBothLegsAtOnce) {
  // A slow prefill: decode's leg must arrive long before prefill is done.
  Sim p("prefill", mooncake_sim({"--engine-id", "mc-prefill", "--prefill-base-ms", "300"})),
      d("decode", mooncake_sim());
  Gateway gw({"--kv-connector", "mooncake", "--mooncake-bootstrap-port", "0", "--prefill",
              p.hostport(), "--decode", d.hostport()});
  for (bool stream : {false, true}) {
    p.clear();
    d.clear();
    auto r = post_json(gw.port(), "/v1/chat/completions", kv_chat(stream));
    ASSERT_EQ(r.status, 200) << r.body;
    auto pre = p.requests();
    auto dec = d.requests();
    ASSERT_EQ(pre.size(), 1u);
    ASSERT_EQ(dec.size(), 1u);
    const Json pk = kv_of(pre[0]);
    const Json dk = kv_of(dec[0]);
    const std::string id = pk.value("transfer_id", "");
    EXPECT_TRUE(std::regex_match(id, std::regex("xfer-[0-9a-f]{32}"))) << pk;
    EXPECT_EQ(
        pk, Json({{"do_remote_decode", true}, {"do_remote_prefill", false}, {"transfer_id", id}}));
    EXPECT_EQ(dk, Json({{"do_remote_decode", false},
                        {"do_remote_prefill", true},
                        {"transfer_id", id},
                        {"remote_bootstrap_addr", p.url()},
                        {"remote_engine_id", "mc-prefill"}}));
    EXPECT_EQ(dec[0]["kv_result"], "valid");
    EXPECT_EQ(pre[0]["x_request_id"], dec[0]["x_request_id"]);
    // In parallel: decode was received before prefill was half done.
    EXPECT_LT(dec[0]["received_at_ms"].get<std::int64_t>(),
              pre[0]["received_at_ms"].get<std::int64_t>() + 150);
    Json pb = Json::parse(pre[0]["body"].get<std::string>());
    EXPECT_EQ(pb["max_tokens"], 1);
    EXPECT_EQ(pb["stream"], false);
  }
}

// --mooncake-legs sequential: older Mooncake engines answer NIXL's pull
// params, relayed to a decode sent after prefill answered.
TEST(Connectors, MooncakeSequentialLegsForOlderEngines) {
  Sim p("prefill"), d("decode");
  Gateway gw({"--kv-connector", "mooncake", "--mooncake-legs", "sequential", "--prefill",
              p.hostport(), "--decode", d.hostport()});
  auto r = post_json(gw.port(), "/v1/chat/completions", kv_chat(false));
  ASSERT_EQ(r.status, 200) << r.body;
  auto pre = p.requests();
  auto dec = d.requests();
  ASSERT_EQ(pre.size(), 1u);
  ASSERT_EQ(dec.size(), 1u);
  EXPECT_TRUE(kv_of(dec[0]).contains("remote_block_ids"));
  EXPECT_EQ(dec[0]["kv_result"], "valid");
  // Decode was sent once prefill had answered (its status line written;
  // the sim notes the request's end only after the connection's turn).
  EXPECT_GE(dec[0]["received_at_ms"].get<std::int64_t>(),
            pre[0]["first_byte_at_ms"].get<std::int64_t>());
}

// A prefill leg that fails aborts the decode leg waiting for its KV (the
// decode engine sees the abort) and the client is told prefill failed.
TEST(Connectors, MooncakePrefillFailureAbortsDecode) {
  Sim p("prefill", mooncake_sim({"--hang"})), d("decode", mooncake_sim());
  Gateway gw({"--kv-connector", "mooncake", "--mooncake-bootstrap-port", "0",
              "--first-byte-timeout", "700ms", "--prefill", p.hostport(), "--decode",
              d.hostport()});
  const auto t0 = Clock::now();
  auto r = post_json(gw.port(), "/v1/chat/completions", kv_chat(false));
  ASSERT_EQ(r.status, 502) << r.body;
  EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("prefill stage failed"),
            std::string::npos)
      << r.body;
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(eventually([&] {
    auto dec = d.requests();
    return dec.size() == 1 && dec[0]["outcome"] == "aborted";
  })) << d.requests().dump();
}

// A decode leg that fails aborts the prefill leg (the prefill engine sees
// the abort) and the client is told decode failed.
TEST(Connectors, MooncakeDecodeFailureAbortsPrefill) {
  Sim p("prefill", mooncake_sim({"--engine-id", "mc-p", "--prefill-base-ms", "5000"})),
      d("decode", mooncake_sim({"--kv-wait-ms", "300"}));
  Gateway gw({"--kv-connector", "mooncake", "--mooncake-bootstrap-port", "0", "--prefill",
              p.hostport(), "--decode", d.hostport()});
  const auto t0 = Clock::now();
  auto r = post_json(gw.port(), "/v1/chat/completions", kv_chat(false));
  ASSERT_EQ(r.status, 502) << r.body;
  EXPECT_EQ(r.json()["error"]["message"], "decode stage failed: the engine answered 500") << r.body;
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  EXPECT_TRUE(eventually([&] {
    auto pre = p.requests();
    return pre.size() == 1 && pre[0]["outcome"] == "aborted";
  })) << p.requests().dump();
}

// A failed prefill leg is failed over as a sequential one would be: both
// legs again, on another prefill (the decode leg was aborted, not at fault).
TEST(Connectors, MooncakeFailedPrefillLegFailsOver) {
  Sim bad("prefill", mooncake_sim({"--error-rate", "1"})), good("prefill", mooncake_sim()),
      d("decode", mooncake_sim());
  Gateway gw({"--kv-connector", "mooncake", "--mooncake-bootstrap-port", "0", "--workers", "1",
              "--prefill", bad.hostport(), good.hostport(), "--decode", d.hostport()});
  for (int i = 0; i < 2; ++i) {
    auto r = post_json(gw.port(), "/v1/chat/completions", kv_chat(false));
    ASSERT_EQ(r.status, 200) << r.body;
  }
  // Round robin sends at least one of the two to the failing prefill;
  // every answer's prefill leg ran once on the good one.
  EXPECT_GE(bad.requests().size(), 1u);
  EXPECT_EQ(good.requests().size(), 2u);
}

// A client that leaves while both legs run aborts both on the engines.
TEST(Connectors, MooncakeClientDisconnectAbortsBothLegs) {
  Sim p("prefill", mooncake_sim({"--prefill-base-ms", "5000"})), d("decode", mooncake_sim());
  Gateway gw({"--kv-connector", "mooncake", "--mooncake-bootstrap-port", "0", "--prefill",
              p.hostport(), "--decode", d.hostport()});
  {
    Connection c(gw.port());
    c.send_request("POST", "/v1/chat/completions", kv_chat(true).dump(),
                   {{"Content-Type", "application/json"}});
    ASSERT_TRUE(eventually([&] { return p.requests().size() == 1 && d.requests().size() == 1; }));
    c.close();
  }
  EXPECT_TRUE(eventually([&] {
    auto pre = p.requests();
    auto dec = d.requests();
    return pre.size() == 1 && dec.size() == 1 && pre[0]["outcome"] == "aborted" &&
           dec[0]["outcome"] == "aborted";
  })) << p.requests().dump()
      << d.requests().dump();
}

// The bootstrap server's answer is required and checked: a prefill host
// without one is a clear 502 and neither leg is sent.
TEST(Connectors, MooncakeWithoutBootstrapServerIsAClearError) {
  Sim p("prefill", mooncake_sim()), d("decode", mooncake_sim());
  // The decode's port answers /query with 404: no bootstrap server there.
  Gateway gw({"--kv-connector", "mooncake", "--mooncake-bootstrap-port", std::to_string(d.port()),
              "--prefill", p.hostport(), "--decode", d.hostport()});
  auto r = post_json(gw.port(), "/v1/chat/completions", kv_chat(false));
  ASSERT_EQ(r.status, 502) << r.body;
  EXPECT_NE(r.body.find("bootstrap"), std::string::npos) << r.body;
  EXPECT_TRUE(p.requests().empty());
  EXPECT_TRUE(d.requests().empty());
}

// A decode pick slower than prefill's lease: pdgate does not send the
// decode leg with params whose blocks are freed; it prefills again
// (counted) and the decode pulls the fresh blocks.
TEST(Connectors, ExpiredLeaseRerunsPrefill) {
  Sim p("prefill", {"--kv-lease-ms", "300"}), d("decode");
  // The first decode pick (one worker, one VM) takes 500 ms.
  EditedFile script("slow_first_decode.lua", R"(
local slow = true
return {
  pick = function(ctx, instances)
    if ctx.stage == "decode" and slow then
      slow = false
      local until_ms = pdgate.now_ms() + 500
      while pdgate.now_ms() < until_ms do end
    end
    return instances[1]
  end,
}
)");
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport(), "--kv-lease", "300ms",
              "--policy-decode", script.path(), "--policy-budget-us", "2000000", "--workers", "1"});
  auto r = post_json(gw.port(), "/v1/completions",
                     {{"model", "sim-model"}, {"prompt", "a lease too short"}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(p.requests().size(), 2u);
  auto dec = d.requests();
  ASSERT_EQ(dec.size(), 1u);
  EXPECT_EQ(dec[0]["kv_result"], "valid");
  EXPECT_EQ(connector_metric(gw.port(), "pdgate_kv_lease_expired_total"), 1);
  EXPECT_EQ(connector_metric(gw.port(), "pdgate_kv_handoff_seconds_count"), 1);
  // The next request is not slowed: no re-run.
  r = post_json(gw.port(), "/v1/completions",
                {{"model", "sim-model"}, {"prompt", "a lease long enough"}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(p.requests().size(), 3u);
  EXPECT_EQ(connector_metric(gw.port(), "pdgate_kv_lease_expired_total"), 1);
}

// The sim's lease as vLLM's: a decode pulling after it finds nothing.
TEST(Connectors, SimLeaseExpires) {
  Sim p("prefill", {"--kv-lease-ms", "100"}), d("decode");
  auto pre = post_json(p.port(), "/v1/completions",
                       {{"model", "sim-model"},
                        {"prompt", "lease"},
                        {"max_tokens", 1},
                        {"kv_transfer_params", {{"do_remote_decode", true}}}});
  ASSERT_EQ(pre.status, 200) << pre.body;
  const Json kv = pre.json()["kv_transfer_params"];
  EXPECT_TRUE(kv["remote_blocks_expiry_time"].is_null());
  EXPECT_EQ(kv["transfer_mode"], "pull");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto r = post_json(
      d.port(), "/v1/completions",
      {{"model", "sim-model"}, {"prompt", "lease"}, {"max_tokens", 1}, {"kv_transfer_params", kv}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(d.requests()[0]["kv_result"], "unknown");
}

// The client's final usage reports prefill's cached_tokens (the prompt's
// real cache hit), not decode's (which counts the blocks it pulled), in a
// whole answer and in a stream's usage event.
TEST(Connectors, UsageReportsPrefillsCachedTokens) {
  const std::vector<std::string> details = {"--enable-prompt-tokens-details"};
  Sim p("prefill", details), d("decode", details);
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  Json body = {
      {"model", "sim-model"}, {"prompt", std::string(200, 'x') + " and a tail"}, {"max_tokens", 3}};
  for (int turn = 0; turn < 2; ++turn) {
    for (bool stream : {false, true}) {
      p.clear();
      d.clear();
      body["stream"] = stream;
      body.erase("stream_options");
      if (stream)
        body["stream_options"] = {{"include_usage", true}};
      auto r = post_json(gw.port(), "/v1/completions", body);
      ASSERT_EQ(r.status, 200) << r.body;
      Json usage;
      if (stream) {
        for (const auto& ev : sse_data(r.body)) {
          if (ev != "[DONE]" && Json::parse(ev).contains("usage"))
            usage = Json::parse(ev)["usage"];
        }
      } else {
        usage = r.json()["usage"];
      }
      const auto pre = p.requests();
      const auto dec = d.requests();
      ASSERT_EQ(pre.size(), 1u);
      ASSERT_EQ(dec.size(), 1u);
      // Decode pulled the whole prompt: it counts all of it as cached.
      EXPECT_EQ(dec[0]["cached_tokens"], dec[0]["prompt_tokens"]);
      ASSERT_TRUE(usage.is_object()) << r.body;
      EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], pre[0]["cached_tokens"]) << r.body;
      if (turn == 0 && !stream) {
        EXPECT_EQ(pre[0]["cached_tokens"], 0);
      }
      if (turn == 1) {
        EXPECT_GT(pre[0]["cached_tokens"].get<int>(), 0);
      }
    }
  }
}

// prompt_logprobs: only prefill computed the prompt, so decode (which received its KV) answers
// null; the client's whole answer carries prefill's, in each choice for completions and at the
// top level for chat, the same as prefill gives for that prompt. Without the field, null stays.
TEST(Connectors, PromptLogprobsComeFromPrefill) {
  Sim p("prefill"), d("decode");
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  const Json completion = {{"model", "sim-model"},
                           {"prompt", "Prompt logprobs come from the prefill engine."},
                           {"max_tokens", 2},
                           {"prompt_logprobs", 1}};
  auto r = post_json(gw.port(), "/v1/completions", completion);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json answer = r.json();
  const Json lp = answer["choices"][0]["prompt_logprobs"];
  ASSERT_TRUE(lp.is_array()) << answer;
  EXPECT_EQ(lp.size(), answer["usage"]["prompt_tokens"].get<std::size_t>());
  EXPECT_TRUE(lp[0].is_null());
  const Json direct = post_json(p.port(), "/v1/completions", completion).json();
  EXPECT_EQ(lp, direct["choices"][0]["prompt_logprobs"]);
  // Decode was asked too, received the KV and could not give them.
  const Json dec = d.requests();
  ASSERT_EQ(dec.size(), 1u);
  EXPECT_EQ(dec[0]["kv_result"], "valid");
  EXPECT_EQ(Json::parse(dec[0]["body"].get<std::string>())["prompt_logprobs"], 1);

  Json chat = kv_chat(false);
  chat["prompt_logprobs"] = 0;
  r = post_json(gw.port(), "/v1/chat/completions", chat);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json chat_answer = r.json();
  ASSERT_TRUE(chat_answer["prompt_logprobs"].is_array()) << chat_answer;
  EXPECT_EQ(chat_answer["prompt_logprobs"].size(),
            chat_answer["usage"]["prompt_tokens"].get<std::size_t>());

  Json plain = completion;
  plain.erase("prompt_logprobs");
  r = post_json(gw.port(), "/v1/completions", plain);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(r.json()["choices"][0]["prompt_logprobs"].is_null());
}

}  // namespace
}  // namespace pdgate::test
