// pdgate ingests KV events published in vLLM's wire format by an independent
// Python publisher (tests/integration/kv_event_publisher.py, python3-zmq and
// python3-msgpack): what it learnt is read back from /metrics, as an operator
// would.
#include <gtest/gtest.h>

#include <unistd.h>

#include <sstream>
#include <thread>

#include "tests/integration/admin_gateway.hpp"
#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

double metric(std::uint16_t port, const std::string& name, const std::string& labels) {
  return metric_sample(port, name, labels);
}

bool have_python_zmq() {
  return access("/usr/bin/python3", X_OK) == 0 &&
         std::system("/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null") == 0;
}

Json stored(std::vector<std::int64_t> hashes, std::optional<std::int64_t> parent,
            std::uint32_t first_token, std::uint32_t block_size) {
  Json tokens = Json::array();
  for (std::size_t i = 0; i < hashes.size() * block_size; ++i)
    tokens.push_back(first_token + i);
  return {{"type", "BlockStored"},
          {"block_hashes", hashes},
          {"parent_block_hash", parent ? Json(*parent) : Json(nullptr)},
          {"token_ids", tokens},
          {"block_size", block_size}};
}

class KvEvents : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_python_zmq())
      GTEST_SKIP() << "needs /usr/bin/python3 with python3-zmq and python3-msgpack";
    publisher_ = std::make_unique<Process>(
        "kv-publisher",
        std::vector<std::string>{"/usr/bin/python3",
                                 source_dir() + "/tests/integration/kv_event_publisher.py"});
    control_ = publisher_->wait_listening();
    const Json ends = get(control_, "/endpoints").json();
    pub_ = ends["pub"];
    replay_ = ends["replay"];
  }

  // A gateway whose prefill instance publishes through the Python publisher.
  void start_gateway(bool with_replay) {
    prefill_ = std::make_unique<Sim>("prefill");
    decode_ = std::make_unique<Sim>("decode");
    std::string events = prefill_->url() + "=" + pub_;
    if (with_replay)
      events += ",replay=" + replay_;
    gateway_ = std::make_unique<Gateway>(
        std::vector<std::string>{"--prefill", prefill_->hostport(), "--decode", decode_->hostport(),
                                 "--kv-events", events, "--kv-events-replay-timeout", "500ms"});
    instance_ = "instance=\"" + prefill_->url() + "\"";
    // ZMQ subscriptions join a moment after they connect: publish empty
    // batches until the gateway has one, so no later batch is lost to that.
    ASSERT_TRUE(eventually(
        [&] {
          post_json(control_, "/publish", {{"events", Json::array()}});
          return metric(gateway_->port(), "pdgate_kv_events_batches_total", instance_) >= 1;
        },
        kLearnWait));
    // Joining late is itself a gap: repaired by replay when there is one,
    // else the feed falls back until the engine clears its cache.
    ASSERT_TRUE(eventually(
        [&] {
          post_json(control_, "/publish", {{"events", {{{"type", "AllBlocksCleared"}}}}});
          return state_is("exact");
        },
        kLearnWait));
    gaps_ = gw_metric("pdgate_kv_events_gaps_total");
    replays_ = gw_metric("pdgate_kv_events_replays_total");
  }

  double gw_metric(const std::string& name, const std::string& extra = {}) {
    return metric(gateway_->port(), name, instance_ + extra);
  }
  bool state_is(const char* state) {
    return gw_metric("pdgate_kv_events_state", ",state=\"" + std::string(state) + "\"") == 1;
  }
  void publish_to(const std::string& path, Json body) {
    auto r = post_json(control_, path, body);
    ASSERT_EQ(r.status, 200) << r.body;
  }
  void publish(Json body) {
    auto r = post_json(control_, "/publish", body);
    ASSERT_EQ(r.status, 200) << r.body;
  }

  std::unique_ptr<Process> publisher_;
  std::uint16_t control_ = 0;
  std::string pub_, replay_, instance_;
  double gaps_ = 0, replays_ = 0;  // after the warm-up
  std::unique_ptr<Sim> prefill_, decode_;
  std::unique_ptr<Gateway> gateway_;
};

// Batches in both layouts (positional arrays and maps) with int and bytes hashes are all applied:
// the index holds every stored block, a removal takes one out, and the feed stays exact.
TEST_F(KvEvents, ArraysAndMapsWithIntAndBytesHashes) {
  start_gateway(true);
  publish({{"layout", "array"}, {"hashes", "int"}, {"events", {stored({1, 2}, {}, 0, 4)}}});
  publish({{"layout", "map"}, {"hashes", "int"}, {"events", {stored({3}, 2, 8, 4)}}});
  publish({{"layout", "array"}, {"hashes", "bytes"}, {"events", {stored({10, 11}, {}, 100, 4)}}});
  publish({{"layout", "map"}, {"hashes", "bytes"}, {"events", {stored({12}, 11, 108, 4)}}});
  EXPECT_TRUE(eventually([&] { return gw_metric("pdgate_kv_index_blocks") == 6; }, kLearnWait))
      << gw_metric("pdgate_kv_index_blocks");
  publish({{"layout", "map"},
           {"hashes", "bytes"},
           {"events", {{{"type", "BlockRemoved"}, {"block_hashes", {12}}}}}});
  publish({{"layout", "array"},
           {"hashes", "int"},
           {"events", {{{"type", "BlockRemoved"}, {"block_hashes", {3}}}}}});
  EXPECT_TRUE(eventually([&] { return gw_metric("pdgate_kv_index_blocks") == 4; }, kLearnWait))
      << gw_metric("pdgate_kv_index_blocks");
  EXPECT_TRUE(state_is("exact"));
  EXPECT_EQ(gw_metric("pdgate_kv_events_decode_errors_total"), 0);
  EXPECT_EQ(gw_metric("pdgate_kv_events_gaps_total"), gaps_);
  EXPECT_GE(gw_metric("pdgate_kv_events_lag_seconds"), 0);
  EXPECT_GE(gw_metric("pdgate_kv_events_freshness_seconds"), 0);
}

// A batch the gateway never received (a gap in sequence numbers) is fetched from the replay
// socket: its blocks are in the index and the feed is exact.
TEST_F(KvEvents, GapRepairedByReplay) {
  start_gateway(true);
  publish({{"drop", true}, {"events", {stored({1, 2}, {}, 0, 4)}}});
  publish({{"events", {stored({3}, 2, 8, 4)}}});
  EXPECT_TRUE(eventually([&] { return gw_metric("pdgate_kv_index_blocks") == 3; }, kLearnWait))
      << gw_metric("pdgate_kv_index_blocks");
  EXPECT_EQ(gw_metric("pdgate_kv_events_gaps_total"), gaps_ + 1);
  EXPECT_EQ(gw_metric("pdgate_kv_events_replays_total"), replays_ + 1);
  EXPECT_EQ(gw_metric("pdgate_kv_events_replay_failures_total"), 0);
  EXPECT_TRUE(state_is("exact"));
}

// A gap the replay socket does not answer: the instance falls back (its blocks dropped, state
// fallback in /metrics) until the engine clears its cache, then it is exact again.
TEST_F(KvEvents, GapWithoutReplayFallsBack) {
  start_gateway(true);
  publish({{"events", {stored({1}, {}, 0, 4)}}});
  ASSERT_TRUE(eventually([&] { return gw_metric("pdgate_kv_index_blocks") == 1; }, kLearnWait));
  post_json(control_, "/replay", {{"enabled", false}});
  publish({{"drop", true}, {"events", {stored({2}, 1, 4, 4)}}});
  publish({{"events", {stored({3}, 2, 8, 4)}}});
  EXPECT_TRUE(eventually([&] { return state_is("fallback"); }, kLearnWait));
  EXPECT_EQ(gw_metric("pdgate_kv_index_blocks"), 0);
  EXPECT_EQ(gw_metric("pdgate_kv_events_replay_failures_total"), 1);
  publish({{"events", {{{"type", "AllBlocksCleared"}}, stored({4}, {}, 0, 4)}}});
  EXPECT_TRUE(eventually([&] { return state_is("exact"); }, kLearnWait));
  EXPECT_EQ(gw_metric("pdgate_kv_index_blocks"), 1);
}

// An engine that restarts numbers its batches from 0 again with an empty cache: the blocks
// stored before are forgotten, the new ones kept, and the feed stays exact.
TEST_F(KvEvents, EngineRestartForgetsItsBlocks) {
  start_gateway(true);
  publish({{"events", {stored({1, 2}, {}, 0, 4)}}});
  ASSERT_TRUE(eventually([&] { return gw_metric("pdgate_kv_index_blocks") == 2; }, kLearnWait));
  ASSERT_EQ(post_json(control_, "/restart", Json::object()).status, 200);
  publish({{"events", {stored({7}, {}, 100, 4)}}});
  EXPECT_TRUE(eventually([&] { return gw_metric("pdgate_kv_index_blocks") == 1; }, kLearnWait))
      << gw_metric("pdgate_kv_index_blocks");
  EXPECT_TRUE(state_is("exact"));
  EXPECT_EQ(gw_metric("pdgate_kv_events_gaps_total"), gaps_);
}

// An instance configured without a replay endpoint falls back on its first gap.
TEST_F(KvEvents, GapWithoutReplayEndpointFallsBack) {
  start_gateway(false);
  publish({{"drop", true}, {"events", {stored({1}, {}, 0, 4)}}});
  publish({{"events", {stored({2}, 1, 4, 4)}}});
  EXPECT_TRUE(eventually([&] { return state_is("fallback"); }, kLearnWait));
  EXPECT_EQ(gw_metric("pdgate_kv_events_replays_total"), 0);
  EXPECT_EQ(gw_metric("pdgate_kv_events_gaps_total"), gaps_ + 1);
}

// Garbage in the payload frame is counted as a decode error and the instance falls back; the
// gateway keeps serving requests.
TEST_F(KvEvents, UndecodablePayloadFallsBackAndGatewayServes) {
  start_gateway(true);
  publish({{"raw", "dd ffffffff 01"}});
  publish({{"raw", "c1"}});
  EXPECT_TRUE(eventually([&] { return state_is("fallback"); }, kLearnWait));
  EXPECT_GE(gw_metric("pdgate_kv_events_decode_errors_total"), 1);
  auto r = post_json(gateway_->port(), "/v1/completions",
                     {{"model", "sim-model"}, {"prompt", "hello"}, {"max_tokens", 3}});
  EXPECT_EQ(r.status, 200) << r.body;
}

// A sim publishing its KV events on a port of its choosing.
std::unique_ptr<Sim> event_sim(const std::string& role, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(),
               {"--kv-events-config",
                R"({"enable_kv_cache_events": true, "publisher": "zmq", )"
                R"("endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://127.0.0.1:*"})"});
  return std::make_unique<Sim>(role, std::move(extra));
}

std::string events_flag(Sim& sim) {
  const Json ev = sim.stats()["kv_events"];
  return sim.url() + "=" + ev["endpoint"].get<std::string>() +
         ",replay=" + ev["replay_endpoint"].get<std::string>();
}

constexpr const char* kExactPolicy = kExactPrefixPolicy;

// Subscriptions join shortly after they connect: the sim resets its cache (publishing
// AllBlocksCleared) until the gateway has heard from it, so no later event is lost to that.
bool heard_from(std::uint16_t gateway, Sim& sim) {
  const std::string instance = "instance=\"" + sim.url() + "\"";
  return eventually(
      [&] {
        http_request(sim.port(), "POST", "/reset_prefix_cache");
        return metric(gateway, "pdgate_kv_events_batches_total", instance) >= 1;
      },
      kLearnWait);
}

std::size_t completions_on(Sim& sim) {
  return sim.requests().size();
}

// A prompt a client sent straight to one engine (not through pdgate) is known to pdgate through
// that engine's KV events: every request with that prompt goes to that engine, none elsewhere.
// `tokenizer`: how the gateway turns the request into the engine's token ids.
void prompt_cached_by_another_client_is_routed_to_its_engine(const std::string& tokenizer) {
  auto p1 = event_sim("prefill");
  auto p2 = event_sim("prefill");
  Sim decode("decode");
  EditedFile policy("exact.lua", kExactPolicy);
  Gateway gw({"--prefill", p1->hostport(), p2->hostport(), "--decode", decode.hostport(),
              "--kv-events", events_flag(*p1), "--kv-events", events_flag(*p2), "--tokenizer",
              tokenizer, "--policy-prefill", policy.path()});
  const std::string instance = "instance=\"" + p2->url() + "\"";
  ASSERT_TRUE(heard_from(gw.port(), *p2));
  std::string prompt;
  for (int i = 0; i < 40; ++i)
    prompt += "The quick brown fox jumps over the lazy dog " + std::to_string(i) + ". ";
  const Json body = {{"model", "sim-model"}, {"prompt", prompt}, {"max_tokens", 2}};
  ASSERT_EQ(post_json(p2->port(), "/v1/completions", body).status, 200);
  ASSERT_TRUE(eventually([&] { return metric(gw.port(), "pdgate_kv_index_blocks", instance) >= 4; },
                         kLearnWait))
      << metric(gw.port(), "pdgate_kv_index_blocks", instance);
  p1->clear();
  p2->clear();
  for (int i = 0; i < 4; ++i) {
    auto r = post_json(gw.port(), "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(completions_on(*p2), 4u);
  EXPECT_EQ(completions_on(*p1), 0u);
}

TEST(KvEventsSim, PromptCachedByAnotherClientIsRoutedToItsEngine) {
  prompt_cached_by_another_client_is_routed_to_its_engine("sim");
}

// The same with the token ids asked of an engine's POST /tokenize before routing (--tokenizer
// vllm): what a deployment of real vLLM engines uses.
TEST(KvEventsSim, TokenIdsFromTheEnginesTokenizeEndpoint) {
  prompt_cached_by_another_client_is_routed_to_its_engine("vllm");
}

// A publisher whose sequence numbers keep going backwards, and whose replay socket never answers,
// does not hold up an honest engine's feed: the honest engine's blocks are in the index within a
// second of its caching them, while the hostile feed is reported fallback (not exact) and its
// replays stay within their budget.
TEST_F(KvEvents, HostileFeedDoesNotStarveAnHonestOne) {
  auto honest = event_sim("prefill");
  Sim hostile("prefill");
  Sim decode("decode");
  Gateway gw({"--prefill", honest->hostport(), hostile.hostport(), "--decode", decode.hostport(),
              "--kv-events", events_flag(*honest), "--kv-events",
              hostile.url() + "=" + pub_ + ",replay=" + replay_, "--tokenizer", "sim"});
  ASSERT_TRUE(heard_from(gw.port(), *honest));
  const std::string honest_label = "instance=\"" + honest->url() + "\"";
  const std::string hostile_label = "instance=\"" + hostile.url() + "\"";
  publish_to("/hostile", {{"interval_ms", 5}});
  // The hostile feed is being read: its gaps have made the gateway ask for a replay.
  ASSERT_TRUE(eventually(
      [&] { return metric(gw.port(), "pdgate_kv_events_replays_total", hostile_label) >= 1; },
      kLearnWait));
  for (int round = 0; round < 2; ++round) {
    std::string prompt;
    for (int i = 0; i < 40; ++i)
      prompt += "Round " + std::to_string(round) + " sentence " + std::to_string(i) + ". ";
    const double before = metric(gw.port(), "pdgate_kv_index_blocks", honest_label);
    ASSERT_EQ(post_json(honest->port(), "/v1/completions",
                        {{"model", "sim-model"}, {"prompt", prompt}, {"max_tokens", 2}})
                  .status,
              200);
    const auto sent = std::chrono::steady_clock::now();
    EXPECT_TRUE(eventually(
        [&] { return metric(gw.port(), "pdgate_kv_index_blocks", honest_label) >= before + 4; },
        std::chrono::seconds(1)))
        << "round " << round << ": the honest engine's blocks were not indexed within 1 s ("
        << metric(gw.port(), "pdgate_kv_index_blocks", honest_label) << " blocks)";
    EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::seconds(1));
    EXPECT_EQ(metric(gw.port(), "pdgate_kv_events_state", honest_label + ",state=\"exact\""), 1);
    EXPECT_NE(metric(gw.port(), "pdgate_kv_events_state", hostile_label + ",state=\"exact\""), 1);
  }
  // Once its numbers have gone backwards past the restart budget, the hostile feed is fallback
  // and stays so (sampled for a second), never exact.
  const auto fallback_for_a_second = [&] {
    for (int i = 0; i < 10; ++i) {
      if (metric(gw.port(), "pdgate_kv_events_state", hostile_label + ",state=\"fallback\"") != 1)
        return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return true;
  };
  EXPECT_TRUE(eventually(fallback_for_a_second, kLearnWait));
  EXPECT_LE(metric(gw.port(), "pdgate_kv_events_replays_total", hostile_label), 3);
}

// Which prefill engine received each of the last requests.
struct Landed {
  std::size_t first = 0, second = 0;
};

// A prompt routed to one prefill engine, then evicted there (its cache reset) and cached on the
// other by a client that called that engine directly. Asked for again through the gateway, the
// shipped kv_aware policy follows the engines' KV events to where the blocks are now, while
// prefix_affinity (which only knows where it sent the prompt) goes back to the engine that
// evicted them. Returns where the three repeats landed: {on the first engine, on the other}.
Landed repeats_after_eviction(const std::string& policy) {
  auto p1 = event_sim("prefill");
  auto p2 = event_sim("prefill");
  Sim decode("decode");
  Gateway gw({"--prefill", p1->hostport(), p2->hostport(), "--decode", decode.hostport(),
              "--kv-events", events_flag(*p1), "--kv-events", events_flag(*p2), "--tokenizer",
              "sim", "--policy-prefill", policy});
  EXPECT_TRUE(heard_from(gw.port(), *p1));
  EXPECT_TRUE(heard_from(gw.port(), *p2));
  std::string prompt;
  for (int i = 0; i < 40; ++i)
    prompt += "Pack my box with five dozen liquor jugs " + std::to_string(i) + ". ";
  const Json body = {{"model", "sim-model"}, {"prompt", prompt}, {"max_tokens", 2}};
  p1->clear();
  p2->clear();
  EXPECT_EQ(post_json(gw.port(), "/v1/completions", body).status, 200);
  const bool on_p1 = completions_on(*p1) == 1;
  Sim& first = on_p1 ? *p1 : *p2;
  Sim& other = on_p1 ? *p2 : *p1;
  EXPECT_EQ(completions_on(first), 1u);
  const std::string first_label = "instance=\"" + first.url() + "\"";
  const std::string other_label = "instance=\"" + other.url() + "\"";
  EXPECT_TRUE(eventually(
      [&] { return metric(gw.port(), "pdgate_kv_index_blocks", first_label) >= 4; }, kLearnWait));
  // Evicted where the gateway sent it, cached on the other engine by another client.
  EXPECT_EQ(http_request(first.port(), "POST", "/reset_prefix_cache").status, 200);
  EXPECT_EQ(post_json(other.port(), "/v1/completions", body).status, 200);
  EXPECT_TRUE(eventually(
      [&] {
        return metric(gw.port(), "pdgate_kv_index_blocks", first_label) == 0 &&
               metric(gw.port(), "pdgate_kv_index_blocks", other_label) >= 4;
      },
      kLearnWait));
  p1->clear();
  p2->clear();
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(post_json(gw.port(), "/v1/completions", body).status, 200);
  return {completions_on(first), completions_on(other)};
}

TEST(KvEventsSim, KvAwareFollowsEvictionsPrefixAffinityDoesNot) {
  const Landed exact = repeats_after_eviction("kv_aware");
  EXPECT_EQ(exact.first, 0u);
  EXPECT_EQ(exact.second, 3u);
  // The same scenario under the approximate index: every repeat goes back to the engine that
  // evicted the prompt (what kv_aware exists to fix).
  const Landed approximate = repeats_after_eviction("prefix_affinity");
  EXPECT_EQ(approximate.first, 3u);
  EXPECT_EQ(approximate.second, 0u);
}

// Two combined (one-hop) engines behind a gateway routing on their KV events with kExactPolicy.
struct OneHopPair {
  std::unique_ptr<Sim> a, b;
  EditedFile policy{"exact.lua", kExactPolicy};
  std::unique_ptr<Gateway> gw;
  std::string a_label, b_label;

  OneHopPair(const std::vector<std::string>& a_args, const std::vector<std::string>& b_args)
      : a(event_sim("both", a_args)), b(event_sim("both", b_args)) {
    gw = std::make_unique<Gateway>(std::vector<std::string>{
        "--decode", a->hostport(), b->hostport(), "--prefill-servers-urls", "disable",
        "--kv-events", events_flag(*a), "--kv-events", events_flag(*b), "--tokenizer", "sim",
        "--policy-decode", policy.path()});
    a_label = "instance=\"" + a->url() + "\"";
    b_label = "instance=\"" + b->url() + "\"";
  }
  double blocks(const std::string& label) {
    return metric(gw->port(), "pdgate_kv_index_blocks", label);
  }
};

std::string long_prompt(const std::string& words, int sentences) {
  std::string prompt;
  for (int i = 0; i < sentences; ++i)
    prompt += words + " " + std::to_string(i) + ". ";
  return prompt;
}

// Both engines serve the base model and the LoRA adapter "ad1", and both cache the same prompt:
// one computed with the adapter, the other with the base model. A request naming the adapter
// goes to the engine holding the adapter's blocks, a base request to the one holding the base
// model's: a LoRA's blocks are not the base model's, in either direction. `format`: how the
// engines encode their events (current vLLM's, or older vLLMs' positional events).
void lora_and_base_requests_route_on_their_own_blocks(const std::string& format) {
  const std::vector<std::string> args = {"--lora-modules", "ad1=/adapters/ad1",
                                         "--kv-events-format", format};
  OneHopPair pair(args, args);
  ASSERT_TRUE(heard_from(pair.gw->port(), *pair.a));
  ASSERT_TRUE(heard_from(pair.gw->port(), *pair.b));
  const std::string prompt = long_prompt("Sphinx of black quartz, judge my vow", 40);
  const Json lora = {{"model", "ad1"}, {"prompt", prompt}, {"max_tokens", 2}};
  const Json base = {{"model", "sim-model"}, {"prompt", prompt}, {"max_tokens", 2}};
  ASSERT_EQ(post_json(pair.a->port(), "/v1/completions", lora).status, 200);
  ASSERT_EQ(post_json(pair.b->port(), "/v1/completions", base).status, 200);
  ASSERT_TRUE(
      eventually([&] { return pair.blocks(pair.a_label) >= 4 && pair.blocks(pair.b_label) >= 4; },
                 kLearnWait));
  pair.a->clear();
  pair.b->clear();
  for (int i = 0; i < 3; ++i) {
    auto r = post_json(pair.gw->port(), "/v1/completions", lora);
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(completions_on(*pair.a), 3u) << "LoRA requests on the engine holding the adapter's";
  EXPECT_EQ(completions_on(*pair.b), 0u);
  pair.a->clear();
  pair.b->clear();
  for (int i = 0; i < 3; ++i) {
    auto r = post_json(pair.gw->port(), "/v1/completions", base);
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(completions_on(*pair.b), 3u) << "base requests on the engine holding the base model's";
  EXPECT_EQ(completions_on(*pair.a), 0u);
}

TEST(KvEventsSim, LoraAndBaseRequestsRouteOnTheirOwnBlocks) {
  lora_and_base_requests_route_on_their_own_blocks("vllm");
}

TEST(KvEventsSim, LoraAndBaseRequestsRouteOnTheirOwnBlocksOldLayout) {
  lora_and_base_requests_route_on_their_own_blocks("array");
}

// A hybrid engine (a full-attention and a sliding-window group) caches the first half of a
// prompt; an engine whose groups are all mamba and sliding window caches the whole prompt. Only
// full-attention blocks hold a prefix: the prompt goes to the hybrid engine, the other's blocks
// are counted as ignored and none of them is in the index, and the hybrid engine's two groups
// index each block once.
TEST(KvEventsSim, NonAttentionGroupsDoNotMakeAnEngineLookCached) {
  OneHopPair pair({"--kv-cache-groups", "full_attention,sliding_window"},
                  {"--kv-cache-groups", "mamba,sliding_window"});
  ASSERT_TRUE(heard_from(pair.gw->port(), *pair.a));
  ASSERT_TRUE(heard_from(pair.gw->port(), *pair.b));
  const std::string prompt = long_prompt("How vexingly quick daft zebras jump", 40);
  const std::string half = prompt.substr(0, prompt.size() / 2);
  const double b_events = metric(pair.gw->port(), "pdgate_kv_events_total", pair.b_label);
  const Json whole = {{"model", "sim-model"}, {"prompt", prompt}, {"max_tokens", 2}};
  ASSERT_EQ(post_json(pair.a->port(), "/v1/completions",
                      {{"model", "sim-model"}, {"prompt", half}, {"max_tokens", 2}})
                .status,
            200);
  ASSERT_EQ(post_json(pair.b->port(), "/v1/completions", whole).status, 200);
  const std::string ignored = "pdgate_kv_index_ignored_blocks_total";
  const auto half_blocks = static_cast<double>(half.size() / (16 * 4));  // 16 tokens of 4 bytes
  // Both engines' stored events are in: the hybrid engine's blocks, and the other engine's two
  // BlockStored (one per group) counted among its events.
  ASSERT_TRUE(eventually(
      [&] {
        return pair.blocks(pair.a_label) == half_blocks &&
               metric(pair.gw->port(), "pdgate_kv_events_total", pair.b_label) >= b_events + 2;
      },
      kLearnWait))
      << pair.blocks(pair.a_label) << " blocks on the hybrid engine";
  EXPECT_EQ(pair.blocks(pair.b_label), 0);
  EXPECT_GE(metric(pair.gw->port(), ignored, pair.b_label + ",reason=\"group\""), 8);
  EXPECT_EQ(metric(pair.gw->port(), ignored, pair.a_label + ",reason=\"group\""), half_blocks);
  pair.a->clear();
  pair.b->clear();
  for (int i = 0; i < 3; ++i) {
    auto r = post_json(pair.gw->port(), "/v1/completions", whole);
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(completions_on(*pair.a), 3u);
  EXPECT_EQ(completions_on(*pair.b), 0u);
}

// Instances added through the admin API with an event endpoint are subscribed, and removed ones
// unsubscribed: their rows appear in and leave /metrics.
TEST(KvEventsSim, AdminAddedInstancesAreSubscribed) {
  auto p1 = event_sim("prefill");
  Sim decode("decode");
  AdminGateway gw({"--prefill", p1->hostport(), "--decode", decode.hostport()});
  auto added = event_sim("prefill");
  const Json ev = added->stats()["kv_events"];
  auto r = gw.call(
      "POST", "/admin/instances",
      {{"role", "prefill"},
       {"url", added->url()},
       {"kv_events", {{"endpoint", ev["endpoint"]}, {"replay_endpoint", ev["replay_endpoint"]}}}});
  ASSERT_EQ(r.status, 201) << r.body;
  EXPECT_EQ(r.json()["kv_events"]["endpoint"], ev["endpoint"]);
  const std::string instance = "instance=\"" + added->url() + "\"";
  EXPECT_TRUE(heard_from(gw.port(), *added));
  const auto bad = gw.call("POST", "/admin/instances",
                           {{"role", "prefill"},
                            {"url", "http://127.0.0.1:1"},
                            {"kv_events", {{"endpoint", "tcp://*:5557"}}}});
  EXPECT_EQ(bad.status, 400) << bad.body;
  const auto id = r.json()["id"].get<std::uint64_t>();
  ASSERT_EQ(gw.call("DELETE", "/admin/instances/" + std::to_string(id)).status, 202);
  EXPECT_TRUE(
      eventually([&] { return metric(gw.port(), "pdgate_kv_events_batches_total", instance) < 0; },
                 kLearnWait));
}

}  // namespace
}  // namespace pdgate::test
