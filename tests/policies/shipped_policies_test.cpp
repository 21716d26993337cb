// Each shipped policy on fake instance sets: what it picks, and that it
// never picks an unhealthy instance while a healthy one exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string_view>

#include "policies/local_kv_index.hpp"
#include "policies/metrics.hpp"
#include "tests/policies/policy_test_util.hpp"

namespace pdgate::policy {
namespace {

using test::engine_for;
using test::fake_instances;
using test::settings_for;

PickContext ctx_for(Stage stage) {
  PickContext c;
  c.stage = stage;
  return c;
}

// Runs `n` picks and counts the chosen instances by index.
std::map<std::size_t, int> spread(InstancePicker& p, const std::vector<InstancePtr>& inst,
                                  const PickContext& ctx, int n) {
  std::map<std::size_t, int> out;
  for (int i = 0; i < n; ++i) {
    auto c = p.pick(inst, ctx);
    for (std::size_t k = 0; k < inst.size(); ++k) {
      if (inst[k] == c)
        ++out[k];
    }
  }
  return out;
}

// No shipped policy picks an unhealthy instance while others are healthy.
TEST(ShippedPolicies, NeverPickUnhealthy) {
  for (const auto& sp : shipped_policies()) {
    auto e = engine_for(sp.name);
    ASSERT_TRUE(e);
    auto p = e->make_picker(0);
    auto inst = fake_instances(5);
    inst[0]->healthy = false;
    inst[3]->healthy = false;
    PickContext ctx = ctx_for(Stage::decode);
    ctx.conversation_id = "conv";
    for (int i = 0; i < 50; ++i) {
      auto c = p->pick(inst, ctx);
      ASSERT_NE(c, nullptr) << sp.name;
      EXPECT_TRUE(c->healthy.load()) << sp.name;
    }
    EXPECT_EQ(e->stats().fallbacks(), 0u) << sp.name;
  }
}

// round_robin visits every healthy instance in turn.
TEST(RoundRobin, EvenSpread) {
  auto e = engine_for("round_robin");
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  const auto s = spread(*p, inst, ctx_for(Stage::decode), 400);
  for (std::size_t k = 0; k < 4; ++k)
    EXPECT_EQ(s.at(k), 100);
}

// The shipped round_robin runs natively (policies/lua_vm.cpp): it answers
// what its script answers, pick for pick, with instances going unhealthy
// and back and sets of different sizes, and keeps the same counter in the
// shared store. The script's own text, loaded from a file, runs in the
// interpreter.
TEST(RoundRobin, NativeAnswersAsTheScript) {
  const ShippedPolicy* rr = nullptr;
  for (const auto& sp : shipped_policies()) {
    if (std::string_view(sp.name) == "round_robin")
      rr = &sp;
  }
  ASSERT_NE(rr, nullptr);
  test::TempScript copy(rr->text, "round_robin_copy");
  auto native = engine_for("round_robin");
  auto script = engine_for(copy.path());
  ASSERT_TRUE(native && script);
  auto pn = native->make_picker(0);
  auto ps = script->make_picker(0);
  auto inst = fake_instances(5);
  auto few = std::vector<InstancePtr>(inst.begin(), inst.begin() + 3);
  for (int i = 0; i < 200; ++i) {
    inst[static_cast<std::size_t>(i % 5)]->healthy = (i / 5) % 3 != 0;
    const bool all_down = i % 37 == 0;
    if (all_down) {
      for (auto& x : inst)
        x->healthy = false;
    }
    const auto& set = i % 4 == 0 ? few : inst;
    const Stage stage = i % 3 == 0 ? Stage::prefill : Stage::decode;
    EXPECT_EQ(pn->pick(set, ctx_for(stage)), ps->pick(set, ctx_for(stage))) << "pick " << i;
    if (all_down) {
      for (auto& x : inst)
        x->healthy = true;
    }
  }
  for (const char* key : {"round_robin:prefill", "round_robin:decode"}) {
    auto a = native->kv().get(key, 0);
    auto b = script->kv().get(key, 0);
    ASSERT_TRUE(a.has_value() && b.has_value()) << key;
    EXPECT_EQ(*a, *b) << key;
  }
  EXPECT_EQ(native->stats().picks.load(), script->stats().picks.load());
  EXPECT_EQ(native->stats().fallbacks(), script->stats().fallbacks());
}

// round_robin keeps a separate rotation per stage.
TEST(RoundRobin, PerStageRotation) {
  auto e = engine_for("round_robin");
  auto p = e->make_picker(0);
  auto pre = fake_instances(2, Role::prefill, 10);
  auto dec = fake_instances(2, Role::decode, 20);
  EXPECT_EQ(p->pick(pre, ctx_for(Stage::prefill)), pre[0]);
  EXPECT_EQ(p->pick(dec, ctx_for(Stage::decode)), dec[0]);
  EXPECT_EQ(p->pick(pre, ctx_for(Stage::prefill)), pre[1]);
  EXPECT_EQ(p->pick(dec, ctx_for(Stage::decode)), dec[1]);
}

// least_load picks the instance with the fewest in-flight requests.
TEST(LeastLoad, PicksFewestInFlight) {
  auto e = engine_for("least_load");
  auto p = e->make_picker(0);
  auto inst = fake_instances(8);
  for (std::size_t k = 0; k < 8; ++k)
    inst[k]->in_flight = 10 + static_cast<int>(k);
  inst[5]->in_flight = 2;
  EXPECT_EQ(p->pick(inst, ctx_for(Stage::decode)), inst[5]);
}

// least_load counts the engine's running+waiting when fresh and larger.
TEST(LeastLoad, UsesEngineQueue) {
  auto e = engine_for("least_load");
  auto p = e->make_picker(0);
  auto inst = fake_instances(2);
  const auto now = steady_now_ms();
  store_metrics(*inst[0], EngineMetrics{4.0, 10.0, 0.9}, now);  // busy via other gateways
  store_metrics(*inst[1], EngineMetrics{1.0, 0.0, 0.1}, now);
  inst[0]->in_flight = 0;
  inst[1]->in_flight = 2;
  EXPECT_EQ(p->pick(inst, ctx_for(Stage::decode)), inst[1]);
}

// least_load spreads ties across equal instances.
TEST(LeastLoad, TiesRotate) {
  auto e = engine_for("least_load");
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  const auto s = spread(*p, inst, ctx_for(Stage::decode), 400);
  for (std::size_t k = 0; k < 4; ++k)
    EXPECT_EQ(s.at(k), 100);
}

// power_of_two never picks the most loaded of many instances and spreads among the idle.
TEST(PowerOfTwo, AvoidsTheBusiest) {
  auto e = engine_for("power_of_two");
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  inst[2]->in_flight = 100;
  const auto s = spread(*p, inst, ctx_for(Stage::decode), 1000);
  EXPECT_EQ(s.count(2), 0u);
  for (std::size_t k : {0u, 1u, 3u})
    EXPECT_GT(s.at(k), 150) << k;
}

// power_of_two counts the load other gateways put on an engine (pdgate.load): an instance idle
// here but busy per its fresh metrics is avoided like one busy here.
TEST(PowerOfTwo, CountsEngineReportedLoad) {
  auto e = engine_for("power_of_two");
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  const auto now = steady_now_ms();
  store_metrics(*inst[1], EngineMetrics{40.0, 60.0, 0.9}, now);  // 100 queued via others
  const auto s = spread(*p, inst, ctx_for(Stage::decode), 1000);
  EXPECT_EQ(s.count(1), 0u);
  for (std::size_t k : {0u, 2u, 3u})
    EXPECT_GT(s.at(k), 150) << k;
}

// session_affinity sends a session to one instance, different sessions apart.
TEST(SessionAffinity, StickyAndSpread) {
  auto e = engine_for("session_affinity");
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  std::set<InstancePtr> homes;
  for (int c = 0; c < 40; ++c) {
    PickContext ctx = ctx_for(Stage::decode);
    ctx.conversation_id = "conversation-" + std::to_string(c);
    auto first = p->pick(inst, ctx);
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(p->pick(inst, ctx), first);
    homes.insert(first);
  }
  EXPECT_EQ(homes.size(), 4u);
}

// session_affinity reads the x-session-id header when there is no conversation_id.
TEST(SessionAffinity, HeaderKey) {
  auto e = engine_for("session_affinity");
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  PickContext ctx = ctx_for(Stage::decode);
  ctx.headers = {{"x-session-id", "s1"}};
  auto first = p->pick(inst, ctx);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(p->pick(inst, ctx), first);
  EXPECT_EQ(e->stats().declined.load(), 0u);
}

// session_affinity moves a session off its instance when that one is over the load bound.
TEST(SessionAffinity, BoundedLoad) {
  auto e = engine_for("session_affinity");
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  PickContext ctx = ctx_for(Stage::decode);
  ctx.conversation_id = "hot";
  auto home = p->pick(inst, ctx);
  home->in_flight = 20;  // the others idle: bound ceil(21/4*1.25) + 2 = 9
  auto moved = p->pick(inst, ctx);
  EXPECT_NE(moved, home);
  home->in_flight = 0;
  EXPECT_EQ(p->pick(inst, ctx), home);  // back once the load is gone
}

// session_affinity: removing an instance moves only the sessions it had.
TEST(SessionAffinity, ConsistentOnRemoval) {
  auto e = engine_for("session_affinity");
  auto p = e->make_picker(0);
  auto inst = fake_instances(5);
  std::vector<InstancePtr> fewer(inst.begin(), inst.end() - 1);
  int moved = 0;
  for (int c = 0; c < 200; ++c) {
    PickContext ctx = ctx_for(Stage::decode);
    ctx.conversation_id = "c" + std::to_string(c);
    auto before = p->pick(inst, ctx);
    auto after = p->pick(fewer, ctx);
    if (before != inst[4] && before != after)
      ++moved;
  }
  EXPECT_EQ(moved, 0);
}

// session_affinity declines requests without a key (round-robin routes them).
TEST(SessionAffinity, NoKeyDeclines) {
  auto e = engine_for("session_affinity");
  auto p = e->make_picker(0);
  EXPECT_NE(p->pick(fake_instances(3), ctx_for(Stage::decode)), nullptr);
  EXPECT_EQ(e->stats().declined.load(), 1u);
}

// The context views its prompt and id: a literal id lives as long as the program, a std::string
// given here must outlive the context.
PickContext prompt_ctx(const std::string& prompt, std::string_view id) {
  PickContext c;
  c.stage = Stage::decode;
  c.prompt_raw = prompt;
  c.request_id = id;
  return c;
}

PickContext prefill_ctx(const std::string& prompt, std::string_view id) {
  PickContext c = prompt_ctx(prompt, id);
  c.stage = Stage::prefill;
  return c;
}

// prefix_affinity sends prompts sharing a long prefix to the same instance,
// and unrelated prompts to their homes: spread over the instances.
TEST(PrefixAffinity, SharedPrefixSticks) {
  auto e = engine_for("prefix_affinity");
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  std::vector<std::string> prompts;
  std::map<int, InstancePtr> home;
  for (int c = 0; c < 16; ++c) {
    const std::string base(3000, static_cast<char>('a' + c));
    for (int turn = 0; turn < 5; ++turn) {
      prompts.push_back(base + std::string(static_cast<std::size_t>(300 * turn), 'z'));
      // Named: the context only views the id, it must outlive the pick.
      const std::string id = std::to_string(c) + "-" + std::to_string(turn);
      PickContext ctx = prompt_ctx(prompts.back(), id);
      auto chosen = p->pick(inst, ctx);
      if (turn == 0)
        home[c] = chosen;
      EXPECT_EQ(chosen, home[c]) << c << " " << turn;
    }
  }
  std::set<InstancePtr> distinct;
  for (auto& [c, i] : home)
    distinct.insert(i);
  EXPECT_EQ(distinct.size(), 4u);
}

// Two replicas share no state when two requests with the same new prefix
// reach them within the same millisecond: both must send it to the same
// instance (its home), not each to its own rotation's next, which would
// compute the prefix twice. Before the homes (each replica's tie-breaking
// rotation), the two agreed on 4 of the 16 here, for both policies.
TEST(PrefixAffinity, ReplicasAgreeOnANewPrefixsHome) {
  for (const char* policy : {"prefix_affinity", "cache_aware"}) {
    auto a = engine_for(policy), b = engine_for(policy);
    auto pa = a->make_picker(0), pb = b->make_picker(0);
    auto inst = fake_instances(4);
    int agreed = 0;
    std::set<InstancePtr> homes;
    for (int c = 0; c < 16; ++c) {
      const std::string prompt(3000, static_cast<char>('A' + c));
      const std::string id = "r" + std::to_string(c);
      // Replicas see different traffic: b has routed one more prompt of
      // its own before each of these.
      const std::string own = "own " + std::to_string(c), own_id = "o" + std::to_string(c);
      PickContext co = prefill_ctx(own, own_id);
      pb->pick(inst, co);
      PickContext ca = prefill_ctx(prompt, id), cb = prefill_ctx(prompt, id);
      const auto x = pa->pick(inst, ca), y = pb->pick(inst, cb);
      agreed += x == y ? 1 : 0;
      homes.insert(x);
    }
    EXPECT_EQ(agreed, 16) << policy;
    EXPECT_EQ(homes.size(), 4u) << policy;
  }
}

// prefix_affinity leaves a matching instance whose queue (prompt tokens every replica has
// waiting there) costs more than computing the whole prompt elsewhere.
TEST(PrefixAffinity, OverloadedMatchLoses) {
  auto e = engine_for("prefix_affinity");
  auto p = e->make_picker(0);
  auto inst = fake_instances(3, Role::prefill);
  const std::string prompt(4000, 'q');  // ~1,000 tokens
  auto home = p->pick(inst, prefill_ctx(prompt, "a"));
  home->others_queued_tokens = 30'000;  // another replica's burst
  auto next = p->pick(inst, prefill_ctx(prompt, "b"));
  EXPECT_NE(next, home);
  // Both now hold the prefix; home's queue is shorter than a cold prompt,
  // which the cache is worth, and shorter than next's.
  home->others_queued_tokens = 600;
  next->others_queued_tokens = 900;
  EXPECT_EQ(p->pick(inst, prefill_ctx(prompt, "c")), home);
}

// Prompts shorter than one block carry no prefix and go least-loaded.
TEST(PrefixAffinity, ShortPromptLeastLoaded) {
  auto e = engine_for("prefix_affinity");
  auto p = e->make_picker(0);
  auto inst = fake_instances(3);
  inst[0]->in_flight = 2;
  inst[1]->in_flight = 0;
  inst[2]->in_flight = 1;
  EXPECT_EQ(p->pick(inst, prompt_ctx("hi", "a")), inst[1]);
}

// A prompt of `blocks` full 256-byte prefix blocks: `head` bytes shared by
// every prompt built with that head, the rest unique to `tail`.
std::string prompt_of(char head, std::size_t head_blocks, const std::string& tail,
                      std::size_t blocks) {
  std::string s(head_blocks * 256, head);
  while (s.size() < blocks * 256)
    s += tail;
  s.resize(blocks * 256);
  return s;
}

// Routes a 40-block prompt (2,560 tokens) to an instance (its home), `warm` more times after
// that, gives the home `requests` in flight holding `queued` prompt tokens, and says whether
// the prompt's next pick stays there.
bool stays_home_under_load(const char* policy, std::size_t instances, int warm, int requests,
                           std::int64_t queued) {
  auto e = engine_for(policy);
  auto p = e->make_picker(0);
  auto inst = fake_instances(instances, Role::prefill);
  const std::string prompt = prompt_of('a', 40, "", 40);
  auto home = p->pick(inst, prefill_ctx(prompt, "r0"));
  for (int i = 1; i <= warm; ++i) {
    const std::string id = "r" + std::to_string(i);
    EXPECT_EQ(p->pick(inst, prefill_ctx(prompt, id)), home) << policy << " " << i;
  }
  home->in_flight = requests;
  home->queued_tokens = queued;
  return p->pick(inst, prefill_ctx(prompt, "last")) == home;
}

constexpr const char* kCachePolicies[] = {"prefix_affinity", "kv_aware", "cache_aware",
                                          "conditional_pd"};

// Behind other busy replicas (ctx.recheck_ms > 0) the shipped cache-aware policies recheck a
// cold start and a cache left, and nothing else: a pick that stays with its cache answers at
// once. The second look (ctx.rechecked) answers as a pick without the offer would.
TEST(CacheAware, RecheckColdStartsAndCachesLeftOnly) {
  for (const char* policy : {"prefix_affinity", "kv_aware", "cache_aware"}) {
    auto e = engine_for(policy);
    auto p = e->make_picker(0);
    auto inst = fake_instances(2, Role::prefill);
    const std::string prompt = prompt_of('r', 40, "", 40);
    const auto offered = [&](std::string_view id) {
      PickContext c = prefill_ctx(prompt, id);
      c.recheck_wait = std::chrono::milliseconds(10);
      return c;
    };
    const auto second = [&](std::string_view id) {
      PickContext c = prefill_ctx(prompt, id);
      c.rechecked = true;
      return c;
    };
    // A cold start: rechecked; the second look starts it.
    PickContext c1 = offered("r1");
    EXPECT_EQ(p->pick(inst, c1), nullptr) << policy;
    EXPECT_TRUE(p->wants_recheck()) << policy;
    PickContext c2 = second("r1");
    auto home = p->pick(inst, c2);
    ASSERT_NE(home, nullptr) << policy;
    EXPECT_FALSE(p->wants_recheck()) << policy;
    // Staying with the cache: answered at once.
    PickContext c3 = offered("r2");
    EXPECT_EQ(p->pick(inst, c3), home) << policy;
    EXPECT_FALSE(p->wants_recheck()) << policy;
    // Leaving it (its queue outweighs the cache): rechecked, then left.
    home->in_flight = 4;
    home->queued_tokens = 4 * 2560;
    PickContext c4 = offered("r3");
    EXPECT_EQ(p->pick(inst, c4), nullptr) << policy;
    EXPECT_TRUE(p->wants_recheck()) << policy;
    PickContext c5 = second("r3");
    auto away = p->pick(inst, c5);
    EXPECT_NE(away, nullptr) << policy;
    EXPECT_NE(away, home) << policy;
    EXPECT_EQ(e->stats().fallbacks(), 0u) << policy;
  }
}

// cache_aware rechecks a choice caching less than a tenth of the prompt as it does a cold
// start: a new conversation sharing only its system prompt's first blocks with earlier ones
// would otherwise start on two engines when it reaches two replicas at once. A prompt most of
// which is cached is still answered at once.
TEST(CacheAware, RechecksAChoiceCachingLittleOfThePrompt) {
  auto e = engine_for("cache_aware");
  auto p = e->make_picker(0);
  auto inst = fake_instances(2, Role::prefill);
  const std::string first = prompt_of('s', 2, "the first conversation ", 40);
  const std::string next = prompt_of('s', 2, "another conversation ", 40);
  auto home = p->pick(inst, prefill_ctx(first, "c1"));
  ASSERT_NE(home, nullptr);
  // 2 of 40 blocks cached on `home`, nothing elsewhere.
  PickContext offered = prefill_ctx(next, "c2");
  offered.recheck_wait = std::chrono::milliseconds(10);
  EXPECT_EQ(p->pick(inst, offered), nullptr);
  EXPECT_TRUE(p->wants_recheck());
  PickContext second = prefill_ctx(next, "c2");
  second.rechecked = true;
  EXPECT_NE(p->pick(inst, second), nullptr);
  EXPECT_FALSE(p->wants_recheck());
  // The whole first prompt is cached on `home`: no wait.
  PickContext again = prefill_ctx(first, "c3");
  again.recheck_wait = std::chrono::milliseconds(10);
  EXPECT_EQ(p->pick(inst, again), home);
  EXPECT_FALSE(p->wants_recheck());
  EXPECT_EQ(e->stats().fallbacks(), 0u);
}

// Every cache-aware policy leaves the instance caching the prompt when the cold work queued
// there (4 prompts of its size) costs more than leaving the cache (three times what it
// saves), and stays while it costs less (2 prompts of its size).
TEST(CacheAware, QueuedColdWorkOutweighsTheCache) {
  for (const char* policy : kCachePolicies) {
    EXPECT_FALSE(stays_home_under_load(policy, 2, 0, 4, 4 * 2560)) << policy;
    EXPECT_TRUE(stays_home_under_load(policy, 2, 0, 2, 2 * 2560)) << policy;
  }
}

// ... and keeps it there when the queue is made of cache hits (ten requests, a few hundred
// uncached tokens in all): a request counts by its work, not by its number.
TEST(CacheAware, QueueOfHitsIsWorthWaitingFor) {
  for (const char* policy : kCachePolicies)
    EXPECT_TRUE(stays_home_under_load(policy, 3, 5, 10, 10 * 40)) << policy;
}

// Load the engine reports beyond what the replicas know (clients calling it directly) counts
// at a request's fixed cost: a dozen such requests do not move a cached 2,560-token prompt.
TEST(CacheAware, ScrapedLoadDoesNotMoveACachedPrompt) {
  for (const char* policy : kCachePolicies) {
    auto e = engine_for(policy);
    auto p = e->make_picker(0);
    auto inst = fake_instances(3, Role::prefill);
    const std::string prompt = prompt_of('e', 40, "", 40);
    auto home = p->pick(inst, prefill_ctx(prompt, "s0"));
    store_metrics(*home, EngineMetrics{4.0, 8.0, 0.5}, steady_now_ms());
    EXPECT_EQ(p->pick(inst, prefill_ctx(prompt, "s1")), home) << policy;
  }
}

// The cost per token each engine was measured at weighs in: of two instances holding the same
// prefix with equal queues, the one whose prefills run 10x slower is not chosen.
TEST(CacheAware, UsesEachEnginesCostPerToken) {
  for (const char* policy : {"cache_aware", "prefix_affinity"}) {
    auto e = engine_for(policy);
    auto p = e->make_picker(0);
    auto inst = fake_instances(2, Role::prefill);
    const std::string head = prompt_of('c', 30, "", 30);
    auto first = p->pick(inst, prefill_ctx(head, "h0"));
    first->healthy = false;
    auto second = p->pick(inst, prefill_ctx(head, "h1"));
    first->healthy = true;
    ASSERT_NE(first, second);
    InstancePtr slow = inst[0], fast = inst[1];
    slow->prefill_ms_per_token = 0.5;
    fast->prefill_ms_per_token = 0.05;
    for (auto& i : inst)
      i->queued_tokens = 1000;
    std::map<InstancePtr, int> count;
    for (int i = 0; i < 20; ++i) {
      const std::string id = "t" + std::to_string(i);
      ++count[p->pick(inst, prefill_ctx(prompt_of('c', 30, id + "-", 40), id))];
    }
    EXPECT_EQ(count.count(slow), 0u) << policy;
    EXPECT_EQ(count[fast], 20) << policy;
  }
}

// cache_aware routes a decode that follows a prefill to the least loaded decode: the KV comes
// from the prefill, so a prompt the decode saw before is no reason to wait there.
TEST(CacheAware, DecodeAfterPrefillLeastLoaded) {
  auto e = engine_for("cache_aware");
  auto p = e->make_picker(0);
  auto inst = fake_instances(3, Role::decode);
  auto prefill = fake_instances(1, Role::prefill, 50);
  const std::string prompt = prompt_of('d', 20, "", 20);
  InstancePtr last;
  for (int i = 0; i < 10; ++i) {
    const std::string id = "d" + std::to_string(i);
    PickContext ctx = prompt_ctx(prompt, id);
    ctx.chosen_prefill = prefill[0].get();
    last = p->pick(inst, ctx);
  }
  last->in_flight = 1;
  PickContext ctx = prompt_ctx(prompt, "after");
  ctx.chosen_prefill = prefill[0].get();
  EXPECT_NE(p->pick(inst, ctx), last);
}

// conversation_decode returns a conversation to its previous decode.
TEST(ConversationDecode, FollowsPreviousDecode) {
  auto e = engine_for("conversation_decode");
  auto p = e->make_picker(0);
  auto inst = fake_instances(4);
  PickContext ctx = ctx_for(Stage::decode);
  ctx.conversation_id = "chat-1";
  auto first = p->pick(inst, ctx);
  PickOutcome ok;
  ok.ok = true;
  ok.stage = Stage::decode;
  p->on_complete(*first, ctx, ok);
  first->in_flight = 2;  // busier than the rest, within the allowance
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(p->pick(inst, ctx), first);
  first->in_flight = 50;  // overloaded: least loaded instead
  EXPECT_NE(p->pick(inst, ctx), first);
  first->in_flight = 0;
  first->healthy = false;  // unhealthy: elsewhere
  EXPECT_NE(p->pick(inst, ctx), first);
}

// conversation_decode remembers across workers (the table is shared).
TEST(ConversationDecode, SharedAcrossWorkers) {
  auto e = engine_for("conversation_decode");
  auto p0 = e->make_picker(0);
  auto p1 = e->make_picker(1);
  auto inst = fake_instances(4);
  PickContext ctx = ctx_for(Stage::decode);
  ctx.conversation_id = "chat-2";
  inst[0]->in_flight = 1;
  inst[1]->in_flight = 1;
  inst[3]->in_flight = 1;
  auto first = p0->pick(inst, ctx);
  ASSERT_EQ(first, inst[2]);
  PickOutcome ok;
  ok.ok = true;
  ok.stage = Stage::decode;
  p0->on_complete(*first, ctx, ok);
  inst[2]->in_flight = 2;
  EXPECT_EQ(p1->pick(inst, ctx), inst[2]);
}

// A failed turn does not move the conversation's entry.
TEST(ConversationDecode, FailedTurnNotRecorded) {
  auto e = engine_for("conversation_decode");
  auto p = e->make_picker(0);
  auto inst = fake_instances(2);
  PickContext ctx = ctx_for(Stage::decode);
  ctx.conversation_id = "chat-3";
  PickOutcome failed;
  failed.stage = Stage::decode;
  p->on_complete(*inst[1], ctx, failed);
  EXPECT_FALSE(e->kv_index().conversation("chat-3").has_value());
}

// Two replicas sharing one KV-location index, each numbering the same engines differently
// (B lists them in reverse, with other ids): what one routed, the other finds, for
// prefix_affinity and for conversation_decode.
TEST(SharedIndex, ReplicasWithDifferentIdsAgree) {
  auto index = std::make_shared<LocalKvIndex>();
  auto a = *PolicyEngine::create(settings_for("prefix_affinity"), index);
  auto b = *PolicyEngine::create(settings_for("prefix_affinity"), index);
  auto pa = a->make_picker(0);
  auto pb = b->make_picker(0);
  auto on_a = fake_instances(4, Role::decode, 1);
  auto on_b = fake_instances(4, Role::decode, 100);
  std::reverse(on_b.begin(), on_b.end());
  for (int c = 0; c < 4; ++c) {
    const std::string prompt(3000, static_cast<char>('a' + c));
    auto chosen_a = pa->pick(on_a, prompt_ctx(prompt, "a" + std::to_string(c)));
    auto chosen_b = pb->pick(on_b, prompt_ctx(prompt, "b" + std::to_string(c)));
    ASSERT_NE(chosen_a, nullptr);
    ASSERT_NE(chosen_b, nullptr);
    EXPECT_EQ(chosen_b->spec.url, chosen_a->spec.url) << c;
  }

  auto ca = *PolicyEngine::create(settings_for("conversation_decode"), index);
  auto cb = *PolicyEngine::create(settings_for("conversation_decode"), index);
  auto qa = ca->make_picker(0);
  auto qb = cb->make_picker(0);
  PickContext ctx = ctx_for(Stage::decode);
  ctx.conversation_id = "chat-x";
  PickOutcome ok;
  ok.ok = true;
  ok.stage = Stage::decode;
  auto first = qa->pick(on_a, ctx);
  qa->on_complete(*first, ctx, ok);
  // B's own rotation would start elsewhere: move it on a little too.
  PickContext other = ctx_for(Stage::decode);
  qb->pick(on_b, other);
  for (int i = 0; i < 3; ++i) {
    auto next = qb->pick(on_b, ctx);
    ASSERT_NE(next, nullptr);
    EXPECT_EQ(next->spec.url, first->spec.url) << i;
  }
}

}  // namespace
}  // namespace pdgate::policy
