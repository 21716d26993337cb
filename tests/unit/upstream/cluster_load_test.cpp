// What replicas' load reports add up to (core/upstream/cluster_load.hpp) and what the load
// model predicts from it (core/upstream/load_model.hpp).
#include "core/upstream/cluster_load.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <span>
#include <vector>

#include "core/routing/kv_location_index.hpp"
#include "core/upstream/load_model.hpp"
#include "core/upstream/replica_order.hpp"

namespace pdgate {
namespace {

InstancePtr instance(std::uint64_t id, const std::string& host, Role role = Role::both) {
  UpstreamSpec spec;
  spec.host = host;
  spec.port = 8000;
  spec.role = role;
  spec.url = "http://" + host + ":8000";
  return std::make_shared<Instance>(id, spec);
}

std::shared_ptr<InstanceSet> set_of(std::vector<InstancePtr> list) {
  auto s = std::make_shared<InstanceSet>();
  s->by_id = std::move(list);
  return s;
}

LoadReport report(std::uint64_t origin, std::uint64_t seq, std::vector<LoadEntry> entries) {
  return {origin, seq, 0, std::move(entries)};
}

TEST(ClusterLoad, SumsOtherReplicasAndReplacesEachWhole) {
  auto a = instance(1, "10.0.0.1"), b = instance(2, "10.0.0.2");
  ClusterLoad c;
  c.use_instances(set_of({a, b}));
  const InstanceKey ka = load_key(*a), kb = load_key(*b);
  EXPECT_EQ(c.apply(report(7, 1, {{ka, 2, 500}, {kb, 1, 0}}), 99, 0),
            ClusterLoad::Applied::applied);
  EXPECT_EQ(c.apply(report(8, 1, {{ka, 3, 100}}), 99, 0), ClusterLoad::Applied::applied);
  EXPECT_EQ(a->others_in_flight.load(), 5);
  EXPECT_EQ(a->others_queued_tokens.load(), 600);
  EXPECT_EQ(b->others_in_flight.load(), 1);
  // A new report replaces the replica's last one whole: b is no longer named.
  c.apply(report(7, 2, {{ka, 1, 0}}), 99, 0);
  EXPECT_EQ(a->others_in_flight.load(), 4);
  EXPECT_EQ(a->others_queued_tokens.load(), 100);
  EXPECT_EQ(b->others_in_flight.load(), 0);
  // Stale or own reports change nothing.
  EXPECT_EQ(c.apply(report(7, 1, {{ka, 50, 0}}), 99, 0), ClusterLoad::Applied::stale);
  EXPECT_EQ(c.apply(report(99, 1, {{ka, 50, 0}}), 99, 0), ClusterLoad::Applied::own);
  EXPECT_EQ(a->others_in_flight.load(), 4);
  // This replica's own figures stay its own.
  a->in_flight = 2;
  EXPECT_EQ(a->cluster_in_flight(), 6);
}

TEST(ClusterLoad, SilentReplicasExpireAndNewInstancesGetTheSums) {
  auto a = instance(1, "10.0.0.1");
  ClusterLoadLimits limits;
  limits.expiry_ms = 1000;
  ClusterLoad c(limits);
  c.use_instances(set_of({a}));
  c.apply(report(7, 1, {{load_key(*a), 3, 10}}), 99, 0);
  c.apply(report(8, 1, {{load_key(*a), 1, 0}}), 99, 900);
  EXPECT_EQ(c.expire(1500), 1u);  // 7 silent 1.5 s; 8 heard 0.6 s ago
  EXPECT_EQ(a->others_in_flight.load(), 1);
  EXPECT_EQ(c.replicas(), 1u);
  // The same engine re-added (a new Instance): it starts with the sums.
  auto again = instance(3, "10.0.0.1");
  c.use_instances(set_of({again}));
  EXPECT_EQ(again->others_in_flight.load(), 1);
  c.clear();
  EXPECT_EQ(again->others_in_flight.load(), 0);
  EXPECT_EQ(c.replicas(), 0u);
}

TEST(ClusterLoad, BoundsOnReplicasAndEntries) {
  ClusterLoadLimits limits;
  limits.max_replicas = 2;
  limits.max_entries = 1;
  ClusterLoad c(limits);
  EXPECT_EQ(c.apply(report(1, 1, {}), 99, 0), ClusterLoad::Applied::applied);
  EXPECT_EQ(c.apply(report(2, 1, {}), 99, 0), ClusterLoad::Applied::applied);
  EXPECT_EQ(c.apply(report(3, 1, {}), 99, 0), ClusterLoad::Applied::too_many_replicas);
  EXPECT_EQ(c.apply(report(1, 2, {{5, 1, 1}, {6, 1, 1}}), 99, 0),
            ClusterLoad::Applied::too_many_entries);
}

TEST(ClusterLoad, LocalReportMergesOneEngineInTwoRoles) {
  auto p = instance(1, "10.0.0.1", Role::prefill), d = instance(2, "10.0.0.1", Role::decode);
  auto idle = instance(3, "10.0.0.2");
  p->in_flight = 2;
  p->queued_tokens = 300;
  d->in_flight = 1;
  ClusterLoad c;
  c.use_instances(set_of({p, d, idle}));
  const LoadReport r = c.local_report(5, 9, 1234);
  ASSERT_EQ(r.entries.size(), 1u);  // the idle engine is not named
  EXPECT_EQ(r.entries[0].instance, load_key(*p));
  EXPECT_EQ(r.entries[0].in_flight, 3);
  EXPECT_EQ(r.entries[0].queued_tokens, 300);
  EXPECT_EQ(r.seq, 9u);
}

// The order rechecked picks wait in (core/upstream/replica_order.hpp): the replicas with load
// whose origin comes first; idle ones, forgotten ones and this one do not count.
TEST(ClusterLoad, BusyBeforeCountsLoadedReplicasWithSmallerOrigins) {
  auto a = instance(1, "10.0.0.1");
  ClusterLoad c(ClusterLoadLimits{.expiry_ms = 100});
  c.use_instances(set_of({a}));
  const InstanceKey ka = load_key(*a);
  EXPECT_EQ(c.busy_before(50), 0u);
  c.apply(report(10, 1, {{ka, 1, 0}}), 50, 0);
  c.apply(report(20, 1, {}), 50, 0);  // alive, idle: picks nothing to wait for
  c.apply(report(30, 1, {{ka, 0, 400}}), 50, 0);
  c.apply(report(70, 1, {{ka, 2, 0}}), 50, 0);  // after this one
  EXPECT_EQ(c.busy_before(50), 2u);
  EXPECT_EQ(c.busy_before(5), 0u);
  EXPECT_EQ(c.busy_before(100), 3u);
  c.apply(report(10, 2, {}), 50, 50);  // its requests ended
  EXPECT_EQ(c.busy_before(50), 1u);
  c.expire(120);  // 20, 30 and 70 were last heard at 0: forgotten; 10 (idle now) stays
  EXPECT_EQ(c.busy_before(50), 0u);
  EXPECT_EQ(c.replicas(), 1u);
}

// How long a recheck waits: a slot per replica ahead, bounded.
TEST(ReplicaOrder, WaitsASlotPerReplicaAheadUpToTheBound) {
  ReplicaOrder order;
  using std::chrono::milliseconds;
  EXPECT_EQ(order.recheck_wait(milliseconds(10)), milliseconds(0));
  order.set_ahead(3);
  EXPECT_EQ(order.recheck_wait(milliseconds(10)), milliseconds(30));
  EXPECT_EQ(order.recheck_wait(milliseconds(0)), milliseconds(0));
  order.set_ahead(1000);
  EXPECT_EQ(order.recheck_wait(milliseconds(10)), milliseconds(10 * ReplicaOrder::kMaxSlots));
}

TEST(LoadModel, PredictsQueuedTokensAtTheLearntCost) {
  auto a = instance(1, "10.0.0.1"), b = instance(2, "10.0.0.2");
  // Nothing learnt: the prediction is in tokens, the same rule for all.
  EXPECT_DOUBLE_EQ(predicted_ttft_ms(*a, 1000, 0.0, 0), 1000 + kBaseTokens);
  a->others_queued_tokens = 4000;
  a->others_in_flight = 2;
  EXPECT_DOUBLE_EQ(predicted_ttft_ms(*a, 1000, 0.0, 0),
                   4000 + 2 * kBaseTokens + 1000 + kBaseTokens);
  // Learnt from completed prefills: 2 ms per token on b.
  for (int i = 0; i < 50; ++i)
    note_prefill_time(*b, 1000 - kBaseTokens, 2000);
  EXPECT_NEAR(b->prefill_ms_per_token.load(), 2.0, 1e-9);
  EXPECT_NEAR(fleet_ms_per_token({a, b}), 2.0, 1e-9);  // a takes the fleet's
  EXPECT_NEAR(predicted_ttft_ms(*b, 100, fleet_ms_per_token({a, b}), 0), 2.0 * (100 + kBaseTokens),
              1e-9);
  // Engines within 1.5x of the fleet's mean are priced alike (an estimate's
  // noise must not split equal engines); one clearly slower on its own.
  auto c = instance(3, "10.0.0.3");
  c->prefill_ms_per_token = 2.5;
  EXPECT_NEAR(ms_per_token(*c, fleet_ms_per_token({b, c})), 2.25, 1e-9);
  c->prefill_ms_per_token = 8.0;
  EXPECT_NEAR(ms_per_token(*c, fleet_ms_per_token({b, c})), 8.0, 1e-9);
  EXPECT_NEAR(ms_per_token(*b, fleet_ms_per_token({b, c})), 2.0, 1e-9);
  // Absurd timings are bounded, never negative or infinite.
  note_prefill_time(*b, 1, 1e12);
  EXPECT_LE(b->prefill_ms_per_token.load(), 100.0);
  note_prefill_time(*b, 0, 5);  // nothing waited for: nothing learnt
}

// A replica sees the queue ahead of a prefill only as well as the other
// replicas' reports let it: a short prompt sent to an engine that other
// replicas had just given a burst (picks of the same millisecond) waits
// for work nobody counted. Four replicas alternating on the Mooncake trace
// learnt costs of 0.047-0.96 ms per token for engines that cost 0.013-0.017, so
// that each replica priced one or two engines as 5-50x slower and sent
// the prefixes cached there elsewhere (bench/README.md, "Picks that miss each other").
TEST(LoadModel, APrefillThatWaitedBehindUnseenWorkDoesNotMakeItsEngineLookSlow) {
  auto e = instance(1, "10.0.0.1");
  // 14,000-token prompts at 0.012 ms per token.
  for (int i = 0; i < 50; ++i)
    note_prefill_time(*e, 14'000 - kBaseTokens, 168);
  EXPECT_NEAR(e->prefill_ms_per_token.load(), 0.012, 1e-9);
  // A 700-token prompt that waited 500 ms behind a burst it could not see.
  note_prefill_time(*e, 700, 500);
  EXPECT_LT(e->prefill_ms_per_token.load(), 0.012 * 1.1);
  // Still priced with its peers.
  auto peer = instance(2, "10.0.0.2");
  peer->prefill_ms_per_token = 0.012;
  EXPECT_NEAR(ms_per_token(*e, fleet_ms_per_token({e, peer})), fleet_ms_per_token({e, peer}),
              1e-12);
  // A stall of 30 s on a whole prompt is bounded too.
  note_prefill_time(*e, 14'000, 30'000);
  EXPECT_LT(e->prefill_ms_per_token.load(), 0.012 * 1.5);
  // An engine that really became 10x slower is followed within a few
  // dozen prefills.
  for (int i = 0; i < 40; ++i)
    note_prefill_time(*e, 14'000 - kBaseTokens, 1680);
  EXPECT_GT(e->prefill_ms_per_token.load(), 0.12 * 0.9);
  EXPECT_LT(e->prefill_ms_per_token.load(), 0.12 * 1.01);
}

TEST(LoadModel, RoutingLoadCountsFreshEngineLoadBeyondTheReplicas) {
  auto a = instance(1, "10.0.0.1");
  a->in_flight = 2;
  a->others_in_flight = 3;
  a->engine_other_load = 4;
  EXPECT_EQ(routing_load(*a, 100'000), 5);  // no scrape yet
  a->metrics_at_ms = 99'000;
  EXPECT_EQ(routing_load(*a, 100'000), 9);
  EXPECT_EQ(routing_load(*a, 99'000 + kEngineMetricsFreshMs + 1), 5);  // too old
}

TEST(LoadModel, ColdPromptsHomeIsTheSameForEveryReplicaAndSpreadsPrefixes) {
  const std::vector<std::uint64_t> keys = {
      instance_key("http://10.0.0.1:8000"), instance_key("http://10.0.0.2:8000"),
      instance_key("http://10.0.0.3:8000"), instance_key("http://10.0.0.4:8000")};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Equal costs: every prefix has one home, and 64 prefixes use all four.
  std::vector<int> used(4, 0);
  for (int p = 0; p < 64; ++p) {
    const auto k = static_cast<std::uint64_t>(p) * 0x9e3779b97f4a7c15ull;
    const std::vector<double> idle = {100, 100, 100, 100};
    const auto h = home_among(idle, keys, k, 10);
    ASSERT_LT(h, 4u);
    ++used[h];
    // Another replica, seeing slightly different (within the slack)
    // loads, agrees.
    const std::vector<double> skewed = {103, 100, 109, 101};
    EXPECT_EQ(home_among(skewed, keys, k, 10), h) << p;
    // Beyond the slack, or unhealthy (NaN), the home is passed over.
    std::vector<double> busy = idle;
    busy[h] = 111;
    EXPECT_NE(home_among(busy, keys, k, 10), h);
    busy[h] = nan;
    EXPECT_NE(home_among(busy, keys, k, 10), h);
  }
  for (int n : used)
    EXPECT_GE(n, 8);  // ~16 each: no instance starved
  const std::vector<double> none = {nan, nan};
  EXPECT_EQ(home_among(none, std::span(keys).first(2), 1, 10), 2u);
}

}  // namespace
}  // namespace pdgate
