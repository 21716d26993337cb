// Engines started with data parallelism (vLLM's --data-parallel-size
// behind one API server): pdgate routes to each rank as an instance of its
// own and pins both legs with X-data-parallel-rank; the KV index, the KV
// events and the engine's load are kept per rank. pdgate-sim plays the
// engines (--data-parallel-size).
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <thread>

#include "tests/integration/admin_gateway.hpp"
#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

std::string header_value(const Json& rec, const std::string& name) {
  const Json& h = rec["headers"];
  return h.contains(name) ? h[name].get<std::string>() : std::string("(none)");
}

Json transfer_params_of(const Json& rec) {
  const Json b = Json::parse(rec["body"].get<std::string>(), nullptr, false);
  return b.is_object() && b.contains("kv_transfer_params") ? b["kv_transfer_params"] : Json();
}

Json rank_completion(const std::string& prompt) {
  return {{"model", "sim-model"}, {"prompt", prompt}, {"max_tokens", 3}};
}

// Each rank is an instance (ids consecutive, the rank in the admin view);
// every prefill and decode leg carries the header naming the rank it was
// routed to, and the engine core of that rank served it; decode pulled
// prefill's KV from the core that computed it (NIXL names that core's
// engine id, <id>_dp<rank>).
TEST(DataParallel, BothLegsArePinnedToTheirRanks) {
  Sim p("prefill", {"--data-parallel-size", "2"}), d("decode", {"--data-parallel-size", "2"});
  AdminGateway gw({"--prefill", p.hostport(), "--decode", d.hostport(), "--data-parallel",
                   p.url() + "=2", "--data-parallel", d.url() + "=2"});
  const Json instances = gw.instances();
  std::set<std::pair<std::string, int>> listed;
  for (const auto& i : instances) {
    EXPECT_EQ(i["data_parallel_size"], 2) << i;
    if (i["data_parallel_rank"].is_number())
      listed.insert({i.value("role", ""), i["data_parallel_rank"].get<int>()});
  }
  EXPECT_EQ(listed, (std::set<std::pair<std::string, int>>{
                        {"prefill", 0}, {"prefill", 1}, {"decode", 0}, {"decode", 1}}))
      << instances;

  for (bool stream : {false, true}) {
    p.clear();
    d.clear();
    for (int i = 0; i < 4; ++i) {
      Json body = rank_completion("Pinned to a rank, request " + std::to_string(i) + ".");
      body["stream"] = stream;
      auto r = post_json(gw.port(), "/v1/completions", body);
      ASSERT_EQ(r.status, 200) << r.body;
    }
    std::set<std::string> prefill_ranks, decode_ranks;
    for (Sim* sim : {&p, &d}) {
      const Json recs = sim->requests();
      ASSERT_EQ(recs.size(), 4u);
      for (const auto& rec : recs) {
        ASSERT_TRUE(rec["data_parallel_rank"].is_number()) << rec;
        const std::string rank = std::to_string(rec["data_parallel_rank"].get<int>());
        EXPECT_EQ(header_value(rec, "x-data-parallel-rank"), rank) << rec;
        (sim == &p ? prefill_ranks : decode_ranks).insert(rank);
        if (sim == &d) {
          EXPECT_EQ(rec["kv_result"], "valid") << rec;
          const std::string engine = transfer_params_of(rec).value("remote_engine_id", "");
          EXPECT_TRUE(engine.ends_with("_dp0") || engine.ends_with("_dp1")) << engine;
        }
      }
    }
    // Round-robin over the ranks: both of each engine served.
    EXPECT_EQ(prefill_ranks, (std::set<std::string>{"0", "1"}));
    EXPECT_EQ(decode_ranks, (std::set<std::string>{"0", "1"}));
  }
}

// Mooncake: decode names the engine id of the rank prefill's leg was pinned
// to, as prefill's bootstrap server lists it per rank.
TEST(DataParallel, MooncakeDecodeNamesThePinnedPrefillRank) {
  Sim p("prefill",
        {"--kv-connector", "mooncake", "--data-parallel-size", "2", "--engine-id", "mc"}),
      d("decode", {"--kv-connector", "mooncake"});
  Gateway gw({"--kv-connector", "mooncake", "--mooncake-bootstrap-port", "0", "--prefill",
              p.hostport(), "--decode", d.hostport(), "--data-parallel", p.url() + "=2"});
  for (int i = 0; i < 4; ++i) {
    auto r = post_json(gw.port(), "/v1/completions",
                       rank_completion("Mooncake rank " + std::to_string(i)));
    ASSERT_EQ(r.status, 200) << r.body;
  }
  const Json pre = p.requests();
  const Json dec = d.requests();
  ASSERT_EQ(pre.size(), 4u);
  ASSERT_EQ(dec.size(), 4u);
  std::set<std::string> ranks;
  for (const auto& prefill : pre) {
    const std::string rank = header_value(prefill, "x-data-parallel-rank");
    ranks.insert(rank);
    EXPECT_EQ(std::to_string(prefill["data_parallel_rank"].get<int>()), rank);
    const std::string id = transfer_params_of(prefill).value("transfer_id", "");
    bool matched = false;
    for (const auto& decode : dec) {
      if (transfer_params_of(decode).value("transfer_id", "") != id)
        continue;
      matched = true;
      EXPECT_EQ(transfer_params_of(decode).value("remote_engine_id", ""), "mc_dp" + rank) << decode;
      EXPECT_EQ(decode["kv_result"], "valid") << decode;
      // A decode without data parallelism gets no rank header.
      EXPECT_EQ(header_value(decode, "x-data-parallel-rank"), "(none)");
    }
    EXPECT_TRUE(matched) << id;
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1"}));
}

// The KV index keys blocks by rank: a prompt one client sent straight to
// rank 1 of an engine is known to pdgate through rank 1's KV events (its
// own socket, endpoint port + 1), and every request with that prompt goes
// to rank 1, none to rank 0, which shares the address but not the cache.
TEST(DataParallel, KvEventsAreFollowedPerRank) {
  // The engine binds two ports, base and base + 1 (a wildcard host, as
  // vLLM binds then), pdgate connects to them. closed_port() vouches for
  // base only: another base is tried when base + 1 is taken.
  std::uint16_t base = 0;
  std::unique_ptr<Sim> engine;
  for (int attempt = 0; attempt < 10 && !engine; ++attempt) {
    base = closed_port();
    try {
      engine = std::make_unique<Sim>(
          "prefill", std::vector<std::string>{
                         "--data-parallel-size", "2", "--kv-events-config",
                         R"({"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": )"
                         R"("tcp://*:)" +
                             std::to_string(base) + R"("})"});
    } catch (const std::exception&) {
    }
  }
  ASSERT_TRUE(engine) << "no two free ports in a row";
  Sim& p = *engine;
  Sim d("decode");
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(base);
  EditedFile policy("exact.lua", kExactPrefixPolicy);
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport(), "--data-parallel",
              p.url() + "=2", "--kv-events", p.url() + "=" + endpoint, "--tokenizer", "sim",
              "--policy-prefill", policy.path()});
  const std::string rank1 = "instance=\"" + p.url() + "#dp1\"";
  ASSERT_TRUE(eventually(
      [&] {
        http_request(p.port(), "POST", "/reset_prefix_cache");
        return metric_sample(gw.port(), "pdgate_kv_events_batches_total", rank1) >= 1 &&
               metric_sample(gw.port(), "pdgate_kv_events_batches_total",
                             "instance=\"" + p.url() + "#dp0\"") >= 1;
      },
      kLearnWait))
      << get(gw.port(), "/metrics").body;
  std::string prompt;
  for (int i = 0; i < 40; ++i)
    prompt += "The quick brown fox jumps over the lazy dog " + std::to_string(i) + ". ";
  ASSERT_EQ(http_request(p.port(), "POST", "/v1/completions", rank_completion(prompt).dump(),
                         {{"Content-Type", "application/json"}, {"X-data-parallel-rank", "1"}})
                .status,
            200);
  ASSERT_TRUE(eventually(
      [&] { return metric_sample(gw.port(), "pdgate_kv_index_blocks", rank1) >= 4; }, kLearnWait))
      << metric_sample(gw.port(), "pdgate_kv_index_blocks", rank1);
  p.clear();
  for (int i = 0; i < 4; ++i) {
    auto r = post_json(gw.port(), "/v1/completions", rank_completion(prompt));
    ASSERT_EQ(r.status, 200) << r.body;
  }
  const Json recs = p.requests();
  ASSERT_EQ(recs.size(), 4u);
  for (const auto& rec : recs) {
    EXPECT_EQ(rec["data_parallel_rank"], 1) << rec;
    EXPECT_EQ(header_value(rec, "x-data-parallel-rank"), "1");
    EXPECT_GT(rec["cached_tokens"].get<int>(), 0) << rec;
  }
}

// Each rank's load is its own engine core's: the scrape of the engine's
// /metrics keeps only the engine="<rank>" series.
TEST(DataParallel, EngineLoadIsScrapedPerRank) {
  Sim p("prefill", {"--data-parallel-size", "2", "--prefill-base-ms", "3000"}), d("decode");
  AdminGateway gw({"--prefill", p.hostport(), "--decode", d.hostport(), "--data-parallel",
                   p.url() + "=2", "--metrics-interval", "100ms"});
  // A slow request held on rank 1, sent around the gateway.
  std::thread held([&] {
    http_request(p.port(), "POST", "/v1/completions", rank_completion("held on rank one").dump(),
                 {{"Content-Type", "application/json"}, {"X-data-parallel-rank", "1"}});
  });
  int r0 = -1, r1 = -1;
  const bool seen = eventually(
      [&] {
        for (const auto& i : gw.instances()) {
          if (i.value("role", "") != "prefill" || !i["data_parallel_rank"].is_number())
            continue;
          (i["data_parallel_rank"] == 1 ? r1 : r0) = i["load"]["engine_other_load"].get<int>();
        }
        return r1 == 1 && r0 == 0;
      },
      kLearnWait);
  held.join();
  EXPECT_TRUE(seen) << "rank 0: " << r0 << ", rank 1: " << r1;
}

// The admin API acts on the engine, every rank of it, whether it is named
// by its URL (the same on every replica) or by any rank's id.
TEST(DataParallel, AdminActsOnEveryRankByUrlOrId) {
  Sim p("prefill"), d("decode", {"--data-parallel-size", "3"});
  AdminGateway gw(
      {"--prefill", p.hostport(), "--decode", d.hostport(), "--data-parallel", d.url() + "=3"});
  const auto states = [&] {
    std::vector<std::string> out;
    for (const auto& i : gw.instances()) {
      if (i["role"] == "decode")
        out.push_back(i["state"].get<std::string>());
    }
    return out;
  };
  ASSERT_EQ(states(), (std::vector<std::string>{"active", "active", "active"}));
  auto r = gw.call("POST", "/admin/instances/" + d.hostport() + "/drain");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(states(), (std::vector<std::string>{"draining", "draining", "draining"}));
  std::uint64_t rank2 = 0;
  for (const auto& i : gw.instances()) {
    if (i["role"] == "decode" && i["data_parallel_rank"] == 2)
      rank2 = i["id"].get<std::uint64_t>();
  }
  ASSERT_NE(rank2, 0u);
  r = gw.call("POST", "/admin/instances/" + std::to_string(rank2) + "/undrain");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(states(), (std::vector<std::string>{"active", "active", "active"}));
  EXPECT_EQ(post_json(gw.port(), "/v1/completions", rank_completion("after the undrain")).status,
            200);
}

}  // namespace
}  // namespace pdgate::test
