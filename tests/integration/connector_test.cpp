// Each --kv-connector mode's exact upstream requests, through pdgate to
// pdgate-sim prefill and decode instances.
#include <gtest/gtest.h>

#include <regex>

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

}  // namespace
}  // namespace pdgate::test
