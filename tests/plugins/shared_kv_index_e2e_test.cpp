// The KV-location index shared by gateway replicas (issue 15): two real pdgate processes,
// pdgate-sim engines and a real redis-server. Each replica lists the engines in a different
// order, so their numeric instance ids differ: only the shared, URL-keyed records can make
// them agree.
#include <gtest/gtest.h>

#include <atomic>
#include <regex>
#include <thread>

#include "tests/integration/harness.hpp"
#include "tests/plugins/redis_server.hpp"

namespace pdgate::test {
namespace {

using namespace std::chrono_literals;

Json chat(const std::string& content, const std::string& conversation = "") {
  Json b = {{"model", "sim-model"},
            {"messages", Json::array({{{"role", "user"}, {"content", content}}})},
            {"max_tokens", 2},
            {"stream", false}};
  if (!conversation.empty())
    b["conversation_id"] = conversation;
  return b;
}

// A prompt of many prefix blocks that names `marker` in its first block, so no two
// markers share a block.
std::string prompt(const std::string& marker) {
  std::string s = marker + " ";
  while (s.size() < 3000)
    s += marker + " asks about the weather in a city far away; ";
  return s;
}

// Which of `sims` received a completion request whose body contains `marker` (-1: none,
// -2: more than one).
int who_got(std::vector<Sim*>& sims, const std::string& marker) {
  int found = -1;
  for (std::size_t i = 0; i < sims.size(); ++i) {
    for (const auto& r : sims[i]->requests()) {
      if (r.value("body", "").find(marker) != std::string::npos) {
        if (found >= 0 && found != static_cast<int>(i))
          return -2;
        found = static_cast<int>(i);
      }
    }
  }
  return found;
}

// pdgate_kv_index_records_total{kind=...} from a replica's /metrics.
std::uint64_t records(Gateway& g, const std::string& kind) {
  const std::string text = get(g.port(), "/metrics").body;
  std::smatch m;
  const std::regex re("pdgate_kv_index_records_total\\{kind=\"" + kind + "\"\\} ([0-9]+)");
  return std::regex_search(text, m, re) ? std::stoull(m[1]) : 0;
}

std::int64_t queued_bytes(Gateway& g) {
  const std::string text = get(g.port(), "/metrics").body;
  std::smatch m;
  const std::regex re("\npdgate_kv_index_queued_bytes ([0-9]+)");
  return std::regex_search(text, m, re) ? std::stoll(m[1]) : -1;
}

std::vector<std::string> hostports(const std::vector<Sim*>& sims, bool reversed) {
  std::vector<std::string> out;
  for (auto* s : sims)
    out.push_back(s->hostport());
  if (reversed)
    std::reverse(out.begin(), out.end());
  return out;
}

// Replica args: prefill and decode engines (decode only: one hop), in the given order.
std::vector<std::string> replica_args(const RedisServer& redis, const std::vector<Sim*>& prefill,
                                      const std::vector<Sim*>& decode, bool reversed,
                                      std::vector<std::string> extra) {
  std::vector<std::string> a{"--model", "sim-model", "--workers", "1", "--redis", redis.url()};
  if (!prefill.empty()) {
    a.push_back("--prefill");
    for (auto& h : hostports(prefill, reversed))
      a.push_back(h);
  } else {
    a.insert(a.end(), {"--kv-connector", "none"});
  }
  a.push_back("--decode");
  for (auto& h : hostports(decode, reversed))
    a.push_back(h);
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Both replicas read each other's records: a record from each has been applied by the other.
void wait_connected(Gateway& a, Gateway& b) {
  for (int i = 0; i < 2; ++i) {
    Gateway& from = i == 0 ? a : b;
    Gateway& to = i == 0 ? b : a;
    const auto before = records(to, "applied");
    // With a conversation id, so that a conversation record is made whatever the policy.
    const std::string warm = "warmup-" + std::to_string(i);
    ASSERT_EQ(post_json(from.port(), "/v1/chat/completions", chat(prompt(warm), warm)).status, 200);
    ASSERT_TRUE(eventually([&] { return records(to, "applied") > before; }, 10s));
  }
}

// Four prefill and two decode engines behind replicas A and B (prefix_affinity for
// prefill), both reading each other's records.
struct PrefixCluster {
  PrefixCluster() { wait_connected(a, b); }
  RedisServer redis;
  Sim p0{"prefill"}, p1{"prefill"}, p2{"prefill"}, p3{"prefill"}, d0{"decode"}, d1{"decode"};
  std::vector<Sim*> prefills{&p0, &p1, &p2, &p3}, decodes{&d0, &d1};
  std::vector<std::string> policy{"--policy-prefill", "prefix_affinity"};
  Gateway a{replica_args(redis, prefills, decodes, false, policy)};
  Gateway b{replica_args(redis, prefills, decodes, true, policy)};
};

// prefix_affinity: a prompt routed through replica A, sent again through replica B 100 ms
// later, goes to the same prefill engine, for every one of eight prompts.
TEST(SharedKvIndex, PrefixRoutedByAFoundByBWithin100ms) {
  PrefixCluster c;
  Gateway &a = c.a, &b = c.b;
  auto& prefills = c.prefills;
  for (int i = 0; i < 8; ++i) {
    const std::string marker = "prompt-" + std::to_string(i) + "-x";
    ASSERT_EQ(post_json(a.port(), "/v1/chat/completions", chat(prompt(marker))).status, 200);
    const int on_a = who_got(prefills, marker);
    ASSERT_GE(on_a, 0);
    std::this_thread::sleep_for(100ms);
    ASSERT_EQ(post_json(b.port(), "/v1/chat/completions", chat(prompt(marker))).status, 200);
    EXPECT_EQ(who_got(prefills, marker), on_a) << "prompt " << i << " went elsewhere through B";
  }
}

// conversation_decode: a conversation whose turns alternate between replicas A and B stays
// on one decode engine, although each replica also serves other traffic in between.
TEST(SharedKvIndex, ConversationAlternatingReplicasKeepsDecode) {
  RedisServer redis;
  Sim d0("both", {"--itl-ms", "1"}), d1("both", {"--itl-ms", "1"}), d2("both", {"--itl-ms", "1"}),
      d3("both", {"--itl-ms", "1"});
  std::vector<Sim*> decodes{&d0, &d1, &d2, &d3};
  const std::vector<std::string> policy{"--policy", "conversation_decode"};
  Gateway a(replica_args(redis, {}, decodes, false, policy));
  Gateway b(replica_args(redis, {}, decodes, true, policy));
  wait_connected(a, b);
  for (int c = 0; c < 2; ++c) {
    const std::string conv = "chat-" + std::to_string(c);
    for (int turn = 0; turn < 6; ++turn) {
      Gateway& g = turn % 2 == 0 ? a : b;
      // Other traffic moves each replica's tie-breaking rotation.
      for (Gateway* other : {&a, &b}) {
        ASSERT_EQ(post_json(other->port(), "/v1/chat/completions",
                            chat("filler " + conv + " " + std::to_string(turn)))
                      .status,
                  200);
      }
      const std::string marker = conv + "-turn-" + std::to_string(turn) + "-x";
      ASSERT_EQ(post_json(g.port(), "/v1/chat/completions", chat(marker, conv)).status, 200);
      if (turn > 0)
        std::this_thread::sleep_for(100ms);
    }
    const int first = who_got(decodes, conv + "-turn-0-x");
    ASSERT_GE(first, 0);
    for (int turn = 1; turn < 6; ++turn) {
      EXPECT_EQ(who_got(decodes, conv + "-turn-" + std::to_string(turn) + "-x"), first)
          << conv << " turn " << turn << " (through " << (turn % 2 == 0 ? "A" : "B")
          << ") left its decode";
    }
  }
}

// Redis is killed and restarted while both replicas serve traffic: no request fails, and a
// prompt routed through A while Redis was down reaches B's index once Redis is back.
TEST(SharedKvIndex, RedisRestartUnderTrafficNoFailureAndCatchUp) {
  PrefixCluster c;
  Gateway &a = c.a, &b = c.b;
  RedisServer& redis = c.redis;
  auto& prefills = c.prefills;

  std::atomic<bool> stop{false};
  std::atomic<int> sent{0}, failed{0};
  std::thread traffic([&] {
    for (int i = 0; !stop; ++i) {
      Gateway& g = i % 2 == 0 ? a : b;
      const auto r = post_json(g.port(), "/v1/chat/completions",
                               chat(prompt("traffic-" + std::to_string(i % 16))));
      ++sent;
      if (r.status != 200)
        ++failed;
    }
  });
  std::this_thread::sleep_for(300ms);
  redis.kill();
  std::this_thread::sleep_for(300ms);
  const std::string marker = "while-down-x";
  ASSERT_EQ(post_json(a.port(), "/v1/chat/completions", chat(prompt(marker))).status, 200);
  const int on_a = who_got(prefills, marker);
  ASSERT_GE(on_a, 0);
  std::this_thread::sleep_for(500ms);
  const auto applied_before = records(b, "applied");
  const auto published_before = records(a, "published");
  redis.restart();
  // A's queue (the marker's record among it) is published, and B reads again.
  EXPECT_TRUE(eventually(
      [&] { return records(a, "published") > published_before && queued_bytes(a) == 0; }, 15s));
  EXPECT_TRUE(eventually([&] { return records(b, "applied") > applied_before; }, 15s));
  std::this_thread::sleep_for(300ms);
  stop = true;
  traffic.join();
  ASSERT_EQ(post_json(b.port(), "/v1/chat/completions", chat(prompt(marker))).status, 200);
  EXPECT_EQ(who_got(prefills, marker), on_a);
  EXPECT_GT(sent.load(), 4);
  EXPECT_EQ(failed.load(), 0) << "of " << sent.load();
  EXPECT_EQ(records(a, "dropped"), 0u);
}

// --shared-kv-index off: replicas keep their own index, so B does not know A's routes.
TEST(SharedKvIndex, OffKeepsIndexesApart) {
  RedisServer redis;
  Sim p0("prefill"), p1("prefill"), d0("decode");
  std::vector<Sim*> prefills{&p0, &p1}, decodes{&d0};
  const std::vector<std::string> extra{"--policy-prefill", "prefix_affinity", "--shared-kv-index",
                                       "off"};
  Gateway a(replica_args(redis, prefills, decodes, false, extra));
  Gateway b(replica_args(redis, prefills, decodes, true, extra));
  ASSERT_EQ(post_json(a.port(), "/v1/chat/completions", chat(prompt("solo-x"))).status, 200);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(redis.cli("EXISTS pdgate:kv-index"), "0");
  EXPECT_EQ(get(b.port(), "/metrics").body.find("pdgate_kv_index_records_total"),
            std::string::npos);
}

}  // namespace
}  // namespace pdgate::test
