// Multi-turn KV reuse end to end: real pdgate replicas, real pdgate-sim
// engines (decodes issue their own kv params at the end of a turn) and a
// real redis-server. The engines' request logs say which params each
// prefill received and whether its pull was the first use of them.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "tests/integration/harness.hpp"
#include "tests/plugins/redis_server.hpp"

namespace pdgate::test {
namespace {

using namespace std::chrono_literals;

// One conversation's history, grown turn by turn like a chat client does.
struct Conversation {
  explicit Conversation(std::string i) : id(std::move(i)) {}
  std::string id;
  Json messages = Json::array();
  int turns = 0;
  std::string rid_suffix;  // keeps X-Request-Id unique when a history forks
};

struct TurnResult {
  Response response;
  std::string request_id;
};

std::string answer_text(const Response& r, bool stream) {
  if (!stream)
    return r.json()["choices"][0]["message"].value("content", "");
  std::string text;
  for (const auto& d : sse_data(r.body)) {
    if (d == "[DONE]")
      continue;
    Json c = Json::parse(d);
    if (!c["choices"].empty())
      text += c["choices"][0]["delta"].value("content", "");
  }
  return text;
}

// Sends the next turn of `conv` to `port`. `header_id` names the
// conversation with X-Conversation-Id instead of the body field.
TurnResult send_turn(std::uint16_t port, Conversation& conv, bool stream, bool header_id = false) {
  ++conv.turns;
  conv.messages.push_back(
      {{"role", "user"}, {"content", "Question " + std::to_string(conv.turns) + " about P/D?"}});
  Json body = {
      {"model", "sim-model"}, {"messages", conv.messages}, {"max_tokens", 4}, {"stream", stream}};
  TurnResult t;
  t.request_id = conv.id + "-turn-" + std::to_string(conv.turns) + conv.rid_suffix;
  // Reuse is scoped to the client's credential (docs/conversations.md).
  Headers h = {{"X-Request-Id", t.request_id}, {"Authorization", "Bearer e2e-client"}};
  if (header_id) {
    h.emplace_back("X-Conversation-Id", conv.id);
  } else {
    body["conversation_id"] = conv.id;
  }
  t.response = post_json(port, "/v1/chat/completions", body, h);
  if (t.response.status == 200) {
    conv.messages.push_back({{"role", "assistant"}, {"content", answer_text(t.response, stream)}});
  }
  return t;
}

// The prefill engine's record of the request with this X-Request-Id.
Json prefill_record(Sim& p, const std::string& request_id) {
  for (auto& r : p.requests()) {
    if (r.value("x_request_id", Json()).is_string() && r["x_request_id"] == request_id)
      return r;
  }
  return Json();
}

Json prefill_params(const Json& record) {
  return Json::parse(record["body"].get<std::string>())["kv_transfer_params"];
}

// The prefill of this turn read the previous turn's decode blocks: it got
// the params decode issued for `previous_request_id` (decode's host,
// do_remote_decode) and its pull was their first use.
void expect_reused(Sim& p, const std::string& request_id, const std::string& previous_request_id) {
  Json rec = prefill_record(p, request_id);
  ASSERT_TRUE(rec.is_object()) << "no prefill record for " << request_id;
  Json kv = prefill_params(rec);
  EXPECT_EQ(rec["kv_result"], "valid") << request_id << ": " << kv.dump();
  EXPECT_EQ(kv["remote_host"], "127.0.0.1");
  EXPECT_EQ(kv["do_remote_decode"], true);
  EXPECT_EQ(kv["do_remote_prefill"], false);
  EXPECT_EQ(kv.value("remote_request_id", "").rfind("cmpl-" + previous_request_id + "-0-", 0), 0u)
      << request_id << " got " << kv.dump();
}

// The prefill of this turn recomputed: default params, no pull.
void expect_fresh(Sim& p, const std::string& request_id) {
  Json rec = prefill_record(p, request_id);
  ASSERT_TRUE(rec.is_object()) << "no prefill record for " << request_id;
  Json kv = prefill_params(rec);
  EXPECT_EQ(rec["kv_result"], "none") << request_id;
  EXPECT_TRUE(kv["remote_host"].is_null()) << request_id << ": " << kv.dump();
}

Json store_health(std::uint16_t port) {
  return get(port, "/health").json()["conversation_store"];
}

std::vector<std::string> gateway_args(const Sim& p, const Sim& d, std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model",    "sim-model", "--prefill",
                                p.hostport(), "--decode",  d.hostport()};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> decode_flags() {
  return {"--issue-decode-kv", "--itl-ms", "1"};
}

// Two replicas share one Redis; a conversation's turns alternate between
// them (and between streaming and not): every turn after the first reads
// the previous turn's decode blocks, each set used exactly once, and the
// client never sees kv_transfer_params.
TEST(ConversationReuse, TwoReplicasShareRedis) {
  RedisServer redis;
  Sim p("prefill");
  Sim d("decode", decode_flags());
  Gateway gw1(gateway_args(p, d, {"--redis", redis.url()}));
  Gateway gw2(gateway_args(p, d, {"--redis", redis.url()}));
  ASSERT_TRUE(eventually([&] { return store_health(gw1.port())["reachable"] == true; }));
  ASSERT_TRUE(eventually([&] { return store_health(gw2.port())["reachable"] == true; }));
  const Json served_before = d.stats()["kv_pulls_served_total"];

  Conversation conv{"conv-a"};
  std::string previous;
  for (int t = 0; t < 6; ++t) {
    Gateway& gw = t % 2 == 0 ? gw1 : gw2;
    const bool stream = (t / 2) % 2 == 0;
    auto r = send_turn(gw.port(), conv, stream);
    ASSERT_EQ(r.response.status, 200) << r.response.body;
    EXPECT_EQ(r.response.body.find("kv_transfer_params"), std::string::npos) << r.response.body;
    if (t == 0) {
      expect_fresh(p, r.request_id);
    } else {
      expect_reused(p, r.request_id, previous);
    }
    previous = r.request_id;
  }
  const Json served = d.stats()["kv_pulls_served_total"];
  EXPECT_EQ(served["valid"].get<int>() - served_before["valid"].get<int>(), 5);
  EXPECT_EQ(served["reused"], served_before["reused"]);
  EXPECT_EQ(served["unknown"], served_before["unknown"]);
  Json h1 = store_health(gw1.port());
  Json h2 = store_health(gw2.port());
  EXPECT_EQ(h1["kind"], "redis");
  EXPECT_EQ(h1["hits"].get<int>() + h2["hits"].get<int>(), 5);
  EXPECT_EQ(h1["errors"].get<int>() + h2["errors"].get<int>(), 0);
}

// A conversation idle past --conversation-ttl falls back to a miss (Redis).
TEST(ConversationReuse, RedisTtlExpiry) {
  RedisServer redis;
  Sim p("prefill");
  Sim d("decode", decode_flags());
  Gateway gw(gateway_args(p, d, {"--redis", redis.url(), "--conversation-ttl", "1s"}));
  ASSERT_TRUE(eventually([&] { return store_health(gw.port())["reachable"] == true; }));
  Conversation conv{"conv-ttl"};
  auto t1 = send_turn(gw.port(), conv, true);
  ASSERT_EQ(t1.response.status, 200);
  std::this_thread::sleep_for(1500ms);
  auto t2 = send_turn(gw.port(), conv, true);
  ASSERT_EQ(t2.response.status, 200);
  expect_fresh(p, t2.request_id);
}

// Two concurrent turns of one conversation, one per replica: only one of
// them gets the stored params; the other recomputes.
TEST(ConversationReuse, ConcurrentTurnsTakeOnce) {
  RedisServer redis;
  Sim p("prefill");
  Sim d("decode", decode_flags());
  Gateway gw1(gateway_args(p, d, {"--redis", redis.url()}));
  Gateway gw2(gateway_args(p, d, {"--redis", redis.url()}));
  ASSERT_TRUE(eventually([&] { return store_health(gw1.port())["reachable"] == true; }));
  ASSERT_TRUE(eventually([&] { return store_health(gw2.port())["reachable"] == true; }));
  for (int round = 0; round < 3; ++round) {
    Conversation conv{"conv-race-" + std::to_string(round)};
    ASSERT_EQ(send_turn(gw1.port(), conv, false).response.status, 200);
    Conversation a = conv, b = conv;
    a.rid_suffix = "-a";
    b.rid_suffix = "-b";
    auto fa = std::async(std::launch::async, [&] { return send_turn(gw1.port(), a, false); });
    auto fb = std::async(std::launch::async, [&] { return send_turn(gw2.port(), b, true); });
    auto ra = fa.get();
    auto rb = fb.get();
    ASSERT_EQ(ra.response.status, 200);
    ASSERT_EQ(rb.response.status, 200);
    int reused = 0;
    for (auto& rec : p.requests()) {
      if (rec["x_request_id"] != ra.request_id && rec["x_request_id"] != rb.request_id)
        continue;
      reused += rec["kv_result"] == "valid";
      EXPECT_NE(rec["kv_result"], "reused");
    }
    EXPECT_EQ(reused, 1) << "round " << round;
  }
  EXPECT_EQ(d.stats()["kv_pulls_served_total"]["reused"], 0);
}

// Redis killed mid-conversation: turns keep succeeding as misses and the
// store reports errors; restarted, hits resume without restarting pdgate.
TEST(ConversationReuse, RedisOutageThenRecovery) {
  RedisServer redis;
  Sim p("prefill");
  Sim d("decode", decode_flags());
  Gateway gw(gateway_args(p, d, {"--redis", redis.url()}));
  ASSERT_TRUE(eventually([&] { return store_health(gw.port())["reachable"] == true; }));
  Conversation conv{"conv-outage"};
  auto t1 = send_turn(gw.port(), conv, true);
  ASSERT_EQ(t1.response.status, 200);

  redis.kill();
  for (int i = 0; i < 3; ++i) {
    auto t = send_turn(gw.port(), conv, i % 2 == 0);
    ASSERT_EQ(t.response.status, 200) << t.response.body;
    expect_fresh(p, t.request_id);
  }
  Json h = store_health(gw.port());
  EXPECT_EQ(h["reachable"], false);
  EXPECT_GT(h["errors"].get<int>(), 0);

  redis.restart();
  ASSERT_TRUE(eventually([&] { return store_health(gw.port())["reachable"] == true; }, 15s));
  // The restarted Redis is empty: this turn misses, stores, and the next hits.
  auto t5 = send_turn(gw.port(), conv, true);
  ASSERT_EQ(t5.response.status, 200);
  auto t6 = send_turn(gw.port(), conv, false);
  ASSERT_EQ(t6.response.status, 200);
  expect_reused(p, t6.request_id, t5.request_id);
}

// The in-memory store (no --redis) on one replica: reuse on every turn
// after the first, X-Conversation-Id works like the body field, the TTL
// applies, and concurrent turns take the entry once.
TEST(ConversationReuse, MemoryStoreSingleReplica) {
  Sim p("prefill");
  Sim d("decode", decode_flags());
  Gateway gw(gateway_args(p, d, {"--conversation-ttl", "1s"}));
  Json h = store_health(gw.port());
  EXPECT_EQ(h["kind"], "memory");
  EXPECT_EQ(h["reachable"], true);

  Conversation conv{"conv-mem"};
  std::string previous;
  for (int t = 0; t < 4; ++t) {
    auto r = send_turn(gw.port(), conv, t % 2 == 0, /*header_id=*/t == 2);
    ASSERT_EQ(r.response.status, 200);
    EXPECT_EQ(r.response.body.find("kv_transfer_params"), std::string::npos);
    if (t == 0) {
      expect_fresh(p, r.request_id);
    } else {
      expect_reused(p, r.request_id, previous);
    }
    previous = r.request_id;
  }
  EXPECT_EQ(store_health(gw.port())["entries"], 1);

  // Idle past the TTL: a miss, counted as expired.
  std::this_thread::sleep_for(1500ms);
  auto late = send_turn(gw.port(), conv, true);
  ASSERT_EQ(late.response.status, 200);
  expect_fresh(p, late.request_id);
  EXPECT_EQ(store_health(gw.port())["expired"], 1);

  // Two concurrent next turns: one reuses, one recomputes.
  Conversation a = conv, b = conv;
  a.rid_suffix = "-a";
  b.rid_suffix = "-b";
  auto fa = std::async(std::launch::async, [&] { return send_turn(gw.port(), a, false); });
  auto fb = std::async(std::launch::async, [&] { return send_turn(gw.port(), b, true); });
  auto ra = fa.get();
  auto rb = fb.get();
  ASSERT_EQ(ra.response.status, 200);
  ASSERT_EQ(rb.response.status, 200);
  int reused = 0;
  for (auto& rec : p.requests()) {
    if (rec["x_request_id"] == ra.request_id || rec["x_request_id"] == rb.request_id) {
      reused += rec["kv_result"] == "valid";
    }
  }
  EXPECT_EQ(reused, 1);
  EXPECT_EQ(d.stats()["kv_pulls_served_total"]["reused"], 0);
}

// Without a conversation id nothing is taken or stored, and the decode's
// params are still hidden from the client.
// The value after `name ` in the gateway's /metrics, or -1.
double metric_value(std::uint16_t port, const std::string& name) {
  const std::string body = get(port, "/metrics").body;
  const auto at = body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(body.substr(at + name.size() + 2));
}

// Decode engines that hand out no KV params for a turn (not configured for
// bidirectional transfer): each such turn is counted and a warning says
// why reuse cannot happen (once per 30 s); engines that do hand them out
// count nothing.
TEST(ConversationReuse, TurnsWithoutDecodeParamsAreCountedAndWarned) {
  const std::string series = "pdgate_conversation_turns_without_params_total";
  Sim p("prefill");
  Sim silent("decode", {"--itl-ms", "1"});
  Gateway gw(gateway_args(p, silent, {}));
  Conversation conv{"conv-silent"};
  for (int t = 0; t < 3; ++t)
    ASSERT_EQ(send_turn(gw.port(), conv, t % 2 == 0).response.status, 200);
  EXPECT_TRUE(eventually([&] { return metric_value(gw.port(), series) == 3; }))
      << metric_value(gw.port(), series);
  const std::string log = gw.process().log();
  const auto first = log.find("without kv_transfer_params");
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("without kv_transfer_params", first + 1), std::string::npos)
      << "not rate-limited: " << log;

  Sim issuing("decode", decode_flags());
  Gateway ok(gateway_args(p, issuing, {}));
  Conversation good{"conv-issuing"};
  for (int t = 0; t < 3; ++t)
    ASSERT_EQ(send_turn(ok.port(), good, t % 2 == 0).response.status, 200);
  EXPECT_EQ(metric_value(ok.port(), series), 0);
  EXPECT_EQ(ok.process().log().find("without kv_transfer_params"), std::string::npos);
}

TEST(ConversationReuse, NoConversationId) {
  Sim p("prefill");
  Sim d("decode", decode_flags());
  Gateway gw(gateway_args(p, d, {}));
  for (int i = 0; i < 2; ++i) {
    Json body = {{"model", "sim-model"},
                 {"messages", {{{"role", "user"}, {"content", "same prompt"}}}},
                 {"max_tokens", 3},
                 {"stream", i == 0}};
    const std::string rid = "anon-" + std::to_string(i);
    auto r = post_json(gw.port(), "/v1/chat/completions", body, {{"X-Request-Id", rid}});
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(r.body.find("kv_transfer_params"), std::string::npos);
    expect_fresh(p, rid);
  }
  Json h = store_health(gw.port());
  EXPECT_EQ(h["puts"], 0);
  EXPECT_EQ(h["hits"].get<int>() + h["misses"].get<int>(), 0);
}

// --expose-kv-params lets the client see decode's params, streaming and
// not; reuse still works.
TEST(ConversationReuse, ExposeKvParams) {
  Sim p("prefill");
  Sim d("decode", decode_flags());
  Gateway gw(gateway_args(p, d, {"--expose-kv-params=true"}));
  Conversation conv{"conv-exposed"};
  auto t1 = send_turn(gw.port(), conv, true);
  ASSERT_EQ(t1.response.status, 200);
  EXPECT_NE(t1.response.body.find("kv_transfer_params"), std::string::npos);
  auto t2 = send_turn(gw.port(), conv, false);
  ASSERT_EQ(t2.response.status, 200);
  EXPECT_TRUE(t2.response.json().contains("kv_transfer_params"));
  expect_reused(p, t2.request_id, t1.request_id);
}

// Redis behind Sentinel (redis+sentinel://, the first sentinel listed is
// down): the gateway finds the master through the sentinel that answers;
// when the master is killed under traffic, no client request fails (turns
// are cache misses meanwhile), and once Sentinel has promoted the replica
// conversations are stored and reused on the new master.
TEST(ConversationReuse, FollowsSentinelFailover) {
  if (!have_redis_sentinel())
    GTEST_SKIP() << "redis-sentinel is not installed (apt-get install redis-sentinel)";
  RedisServer master;
  RedisServer replica({"--replicaof", "127.0.0.1", std::to_string(master.port())});
  ASSERT_TRUE(eventually(
      [&] {
        return replica.cli("info replication").find("master_link_status:up") != std::string::npos;
      },
      10s));
  RedisSentinel sentinel(master.port());
  // Sentinel promotes only replicas it has learnt of (from the master's INFO).
  ASSERT_TRUE(eventually(
      [&] {
        return sentinel.cli("sentinel replicas mymaster").find(std::to_string(replica.port())) !=
               std::string::npos;
      },
      20s));
  const std::string url = "redis+sentinel://127.0.0.1:" + std::to_string(closed_port()) +
                          ",127.0.0.1:" + std::to_string(sentinel.port()) + "/mymaster";
  Sim p("prefill");
  Sim d("decode", decode_flags());
  Gateway gw(gateway_args(p, d, {"--redis", url}));
  ASSERT_TRUE(eventually([&] { return store_health(gw.port())["reachable"] == true; }, 10s))
      << gw.process().log();

  Conversation before{"conv-sentinel-before"};
  auto b1 = send_turn(gw.port(), before, true);
  ASSERT_EQ(b1.response.status, 200) << b1.response.body;
  auto b2 = send_turn(gw.port(), before, false);
  ASSERT_EQ(b2.response.status, 200) << b2.response.body;
  expect_reused(p, b2.request_id, b1.request_id);
  EXPECT_NE(master.cli("dbsize"), "0");

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::vector<std::string> failures;
  std::thread traffic([&] {
    for (int i = 0; !stop; ++i) {
      Conversation c{"conv-sentinel-load-" + std::to_string(i)};
      for (int t = 0; t < 2; ++t) {
        auto r = send_turn(gw.port(), c, t == 0);
        if (r.response.status == 200)
          ++ok;
        else
          failures.push_back(std::to_string(r.response.status) + " " + r.response.body);
      }
    }
  });
  master.kill();
  const bool promoted = eventually([&] { return sentinel.master_port() == replica.port(); }, 30s);
  // Conversations resume on the promoted master: a fresh one reuses its
  // first turn's blocks (the gateway's connections may take a moment to
  // follow, hence a few tries).
  bool resumed = false;
  for (int i = 0; promoted && !resumed && i < 40; ++i) {
    Conversation after{"conv-sentinel-after-" + std::to_string(i)};
    auto a1 = send_turn(gw.port(), after, true);
    auto a2 = send_turn(gw.port(), after, true);
    ASSERT_EQ(a1.response.status, 200) << a1.response.body;
    ASSERT_EQ(a2.response.status, 200) << a2.response.body;
    resumed = prefill_record(p, a2.request_id)["kv_result"] == "valid";
    if (!resumed)
      std::this_thread::sleep_for(250ms);
  }
  stop = true;
  traffic.join();
  ASSERT_TRUE(promoted) << "sentinel never promoted the replica: "
                        << sentinel.cli("sentinel master mymaster");
  EXPECT_TRUE(resumed) << gw.process().log();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures.front();
  EXPECT_GT(ok.load(), 0);
  EXPECT_NE(replica.cli("dbsize"), "0");
  EXPECT_EQ(replica.cli("role").substr(0, 6), "master");
}

}  // namespace
}  // namespace pdgate::test
