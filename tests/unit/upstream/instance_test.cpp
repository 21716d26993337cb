// Instances and the registry (core/upstream/instance.*): passive ejection after
// consecutive failures, active checks' fall/rise, the re-admission
// back-off, and the registry's add/drain/remove invariants.
#include "core/upstream/instance.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace pdgate {
namespace {

UpstreamSpec spec(Role role, const std::string& hostport) {
  auto s = parse_upstream(role, hostport);
  EXPECT_TRUE(s) << s.error();
  return *s;
}

InstancePtr make(std::uint64_t id = 1) {
  return std::make_shared<Instance>(id, spec(Role::decode, "127.0.0.1:9"));
}

// `eject_after` failures in a row eject (once); a success in between
// starts the count again.
TEST(InstanceHealth, ConsecutiveRequestFailuresEject) {
  auto i = make();
  EXPECT_FALSE(i->note_request_failure(3, "500"));
  EXPECT_FALSE(i->note_request_failure(3, "500"));
  i->note_request_success();
  EXPECT_FALSE(i->note_request_failure(3, "500"));
  EXPECT_FALSE(i->note_request_failure(3, "500"));
  EXPECT_EQ(i->state(), InstanceState::active);
  EXPECT_TRUE(i->note_request_failure(3, "500"));
  EXPECT_EQ(i->state(), InstanceState::ejected);
  EXPECT_EQ(i->ejections.load(), 1u);
  // Further failures while ejected do not eject it again.
  EXPECT_FALSE(i->note_request_failure(3, "500"));
  EXPECT_EQ(i->ejections.load(), 1u);
  const auto h = i->history();
  ASSERT_FALSE(h.empty());
  EXPECT_NE(h.back().what.find("request: 500"), std::string::npos);
}

// Re-admission back-off doubles with each ejection, from 1 s, and is
// capped at a minute.
TEST(InstanceHealth, BackoffDoublesAndCaps) {
  auto i = make();
  std::int64_t previous = 0;
  const std::int64_t expected[] = {1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000};
  for (auto want : expected) {
    const auto before = steady_now_ms();
    ASSERT_TRUE(i->note_request_failure(1, "refused"));
    const auto wait = i->ejected_until_ms.load() - before;
    EXPECT_GE(wait, want);
    EXPECT_LE(wait, want + 50);
    EXPECT_GE(wait, previous);
    previous = wait;
    // Back in (as the back-off would have it) for the next round.
    i->ejected_until_ms.store(steady_now_ms() - 1);
    i->readmit_if_due(false);
    ASSERT_EQ(i->state(), InstanceState::active);
  }
}

// Found by the soak (bench/soak.sh): with each decode restarted every
// minute, their back-offs reached the one-minute cap and stayed there, so
// when one was killed while the other sat out its minute, every request
// got a 503 (1.8 million of them). An instance that served 30 s since it
// was re-admitted starts its back-off over at 1 s; ejections close
// together still double it.
TEST(InstanceHealth, BackoffStartsOverAfterAHealthyPeriod) {
  auto i = make();
  for (int round = 0; round < 7; ++round) {
    ASSERT_TRUE(i->note_request_failure(1, "killed"));
    i->ejected_until_ms.store(steady_now_ms() - 1);
    i->readmit_if_due(false);
  }
  // Ejected again at once: the back-off is at its cap.
  auto before = steady_now_ms();
  ASSERT_TRUE(i->note_request_failure(1, "killed"));
  EXPECT_GE(i->ejected_until_ms.load() - before, 60'000);
  i->ejected_until_ms.store(steady_now_ms() - 1);
  i->readmit_if_due(false);
  // Healthy for longer than the forgiveness period, then ejected: 1 s.
  i->healthy_since_ms.store(steady_now_ms() - Instance::kBackoffForgivenAfterMs - 1);
  before = steady_now_ms();
  ASSERT_TRUE(i->note_request_failure(1, "killed"));
  const auto wait = i->ejected_until_ms.load() - before;
  EXPECT_GE(wait, 1000);
  EXPECT_LE(wait, 1100);
}

// Without active checks an ejected instance comes back once its back-off
// has passed, not before; with checks on, only passed checks readmit it.
TEST(InstanceHealth, ReadmittedAfterBackoffWithoutChecks) {
  auto i = make();
  ASSERT_TRUE(i->note_request_failure(1, "timeout"));
  i->readmit_if_due(false);
  EXPECT_EQ(i->state(), InstanceState::ejected) << "readmitted before its back-off";
  i->ejected_until_ms.store(steady_now_ms() - 1);
  i->readmit_if_due(true);
  EXPECT_EQ(i->state(), InstanceState::ejected) << "checks on: the back-off alone is not enough";
  i->readmit_if_due(false);
  EXPECT_EQ(i->state(), InstanceState::active);
  EXPECT_EQ(i->consecutive_failures.load(), 0u);
  EXPECT_EQ(i->history().back().what, "readmitted after back-off");
}

// Checks: `fall` failures in a row eject; `rise` passes in a row readmit,
// but not before the back-off; one failure resets the passes.
TEST(InstanceHealth, ChecksFallAndRise) {
  auto i = make();
  EXPECT_FALSE(i->note_check(false, 2, 3, "refused"));
  EXPECT_FALSE(i->note_check(false, 2, 3, "refused"));
  EXPECT_TRUE(i->note_check(false, 2, 3, "refused"));
  EXPECT_EQ(i->state(), InstanceState::ejected);
  // Passing checks during the back-off do not readmit.
  EXPECT_FALSE(i->note_check(true, 2, 3, ""));
  EXPECT_FALSE(i->note_check(true, 2, 3, ""));
  EXPECT_EQ(i->state(), InstanceState::ejected);
  i->ejected_until_ms.store(steady_now_ms() - 1);
  // A failure resets the run of passes.
  EXPECT_FALSE(i->note_check(false, 2, 3, "refused"));
  EXPECT_FALSE(i->note_check(true, 2, 3, ""));
  EXPECT_EQ(i->state(), InstanceState::ejected);
  EXPECT_FALSE(i->note_check(true, 2, 3, ""));
  EXPECT_EQ(i->state(), InstanceState::active);
  EXPECT_EQ(i->history().back().what, "readmitted");
}

// The health history keeps the last 20 observations.
TEST(InstanceHealth, HistoryIsBounded) {
  auto i = make();
  for (int n = 0; n < 100; ++n)
    i->record(n % 2 == 0, "event " + std::to_string(n));
  const auto h = i->history();
  ASSERT_EQ(h.size(), 20u);
  EXPECT_EQ(h.front().what, "event 80");
  EXPECT_EQ(h.back().what, "event 99");
}

// An in-flight guard counts a request for exactly as long as it lives,
// moves included.
TEST(InstanceLoad, InFlightGuardCountsOnce) {
  auto i = make();
  {
    InFlightGuard a(i);
    EXPECT_EQ(i->in_flight.load(), 1);
    InFlightGuard b(std::move(a));
    EXPECT_EQ(i->in_flight.load(), 1);
    InFlightGuard c(i);
    EXPECT_EQ(i->in_flight.load(), 2);
    c = std::move(b);
    EXPECT_EQ(i->in_flight.load(), 1);
  }
  EXPECT_EQ(i->in_flight.load(), 0);
  EXPECT_EQ(i->requests_total.load(), 2u);
}

Config two_and_one() {
  Config cfg;
  cfg.prefill = {spec(Role::prefill, "127.0.0.1:8100"), spec(Role::prefill, "127.0.0.1:8101")};
  cfg.decode = {spec(Role::decode, "127.0.0.1:8200")};
  return cfg;
}

// Instances from the configuration get ids in order; find() by id and by
// role and URL; a duplicate URL in the same role is a 409.
TEST(Registry, AddFindAndDuplicates) {
  Registry r(two_and_one());
  auto set = r.snapshot();
  ASSERT_EQ(set->prefill.size(), 2u);
  ASSERT_EQ(set->decode.size(), 1u);
  EXPECT_EQ(set->all().size(), 3u);
  EXPECT_EQ(set->find(2)->spec.port, 8101);
  EXPECT_EQ(set->find(99), nullptr);

  auto dup = r.add(spec(Role::prefill, "127.0.0.1:8100"));
  ASSERT_TRUE(dup.error);
  EXPECT_EQ(status_of(*dup.error), 409u);
  auto added = r.add(spec(Role::decode, "127.0.0.1:8201"), {{"zone", "a"}}, 5);
  ASSERT_FALSE(added.error);
  EXPECT_EQ(added.instance->id, 4u);
  EXPECT_EQ(added.instance->weight(), 5u);
  set = r.snapshot();
  EXPECT_EQ(set->decode.size(), 2u);
  EXPECT_EQ(r.find(Role::decode, added.instance->spec.url), added.instance);
}

// A data-parallel engine is one instance per rank (consecutive ids, the
// rank header rendered, locations apart); drain, undrain and relabel act
// on every rank of the engine; re-adding its URL is a conflict.
TEST(Registry, DataParallelEngineIsOneInstancePerRank) {
  Config cfg = two_and_one();
  cfg.decode[0].dp_size = 3;
  Registry r(cfg);
  auto set = r.snapshot();
  ASSERT_EQ(set->decode.size(), 3u);
  for (std::uint32_t k = 0; k < 3; ++k) {
    const Instance& i = *set->decode[k];
    EXPECT_EQ(i.id, 3u + k);
    EXPECT_EQ(i.spec.dp_rank, k);
    EXPECT_EQ(std::string(i.dp_rank_header), std::to_string(k));
    EXPECT_EQ(i.location, "http://127.0.0.1:8200#dp" + std::to_string(k));
  }
  EXPECT_STREQ(set->prefill[0]->dp_rank_header, "");
  EXPECT_EQ(set->prefill[0]->location, set->prefill[0]->spec.url);

  EXPECT_FALSE(r.drain(4, false).error);
  EXPECT_EQ(r.snapshot()->decode.size(), 0u);
  EXPECT_EQ(r.snapshot()->draining.size(), 3u);
  EXPECT_FALSE(r.undrain(5).error);
  EXPECT_EQ(r.snapshot()->decode.size(), 3u);
  EXPECT_FALSE(r.update(3, Instance::Labels{{"zone", "b"}}, std::nullopt).error);
  for (const auto& i : r.snapshot()->decode)
    EXPECT_EQ(i->labels()->at("zone"), "b");

  EXPECT_TRUE(r.add(spec(Role::decode, "127.0.0.1:8200")).error);
  UpstreamSpec more = spec(Role::decode, "127.0.0.1:8300");
  more.dp_size = 2;
  auto added = r.add(more);
  ASSERT_FALSE(added.error);
  EXPECT_EQ(added.instance->spec.dp_rank, 0u);
  EXPECT_EQ(r.snapshot()->decode.size(), 5u);
  EXPECT_FALSE(r.drain(added.instance->id, true).error);
  r.forget_idle();
  EXPECT_EQ(r.snapshot()->by_id.size(), 5u);
}

// Cluster ids (given by the shared registry): the configured engines take
// theirs, whatever their order; an add with an id lower than those listed
// keeps every list in id order and find() working; an id already taken
// (or in the local range) is a conflict; what has no cluster id is
// numbered from kLocalIdBase when Redis is configured, skipping ids taken.
TEST(Registry, ClusterIdsKeepTheSetInIdOrder) {
  Config cfg = two_and_one();
  cfg.redis_url = "redis://127.0.0.1:6379";
  cfg.decode[0].dp_size = 2;
  const ClusterIds ids = {
      {cluster_id_key(Role::prefill, "http://127.0.0.1:8101", 1), 7},
      {cluster_id_key(Role::decode, "http://127.0.0.1:8200", 2), 3},
  };
  Registry r(cfg, ids);
  auto set = r.snapshot();
  ASSERT_EQ(set->by_id.size(), 4u);
  EXPECT_EQ(set->by_id[0]->id, 3u);
  EXPECT_EQ(set->by_id[1]->id, 4u);  // rank 1
  EXPECT_EQ(set->by_id[2]->id, 7u);
  EXPECT_EQ(set->by_id[3]->id, kLocalIdBase);  // 8100: Redis gave none
  EXPECT_EQ(set->find(7)->spec.url, "http://127.0.0.1:8101");
  EXPECT_EQ(set->prefill[0]->id, 7u);  // lists in id order too

  std::vector<NewInstance> batch;
  batch.push_back({spec(Role::decode, "127.0.0.1:8300"), {}, 1, false, 1});
  batch.push_back({spec(Role::decode, "127.0.0.1:8301"), {}, 1, false, 4});  // rank 1's
  batch.push_back({spec(Role::decode, "127.0.0.1:8302"), {}, 1, false, kLocalIdBase});
  batch.push_back({spec(Role::decode, "127.0.0.1:8303"), {}, 1, false, 0});
  const auto out = r.add(std::move(batch));
  ASSERT_FALSE(out[0].error);
  ASSERT_TRUE(out[1].error);
  EXPECT_EQ(out[1].error->kind, ErrorKind::conflict);
  ASSERT_TRUE(out[2].error);
  ASSERT_FALSE(out[3].error);
  EXPECT_EQ(out[3].instance->id, kLocalIdBase + 1);
  set = r.snapshot();
  EXPECT_TRUE(std::is_sorted(set->by_id.begin(), set->by_id.end(),
                             [](const auto& a, const auto& b) { return a->id < b->id; }));
  EXPECT_EQ(set->find(1)->spec.url, "http://127.0.0.1:8300");
  EXPECT_EQ(set->decode.front()->id, 1u);
  // Removed and added again with its id: back under it.
  EXPECT_FALSE(r.drain(1, true).error);
  r.forget_idle();
  EXPECT_EQ(r.snapshot()->find(1), nullptr);
  std::vector<NewInstance> again;
  again.push_back({spec(Role::decode, "127.0.0.1:8300"), {}, 1, false, 1});
  EXPECT_EQ(r.add(std::move(again)).front().instance->id, 1u);
}

// Without a shared registry ids are 1, 2, ... as before.
TEST(Registry, WithoutRedisIdsFollowTheConfig) {
  Registry r(two_and_one());
  const auto set = r.snapshot();
  for (std::uint64_t k = 0; k < 3; ++k)
    EXPECT_EQ(set->by_id[k]->id, k + 1);
  EXPECT_EQ(r.add(spec(Role::decode, "127.0.0.1:8300")).instance->id, 4u);
}

// A reader's snapshot never changes under it: a change made while one is
// held publishes a new set. With no snapshot held, adds, drains, undrains
// and removals change the published set in place (no copy of every list
// per add), and the next snapshot sees each change.
TEST(Registry, ChangesCopyTheSetOnlyWhileAReaderHoldsIt) {
  Registry r(two_and_one());
  auto held = r.snapshot();
  const InstanceSet* before = held.get();
  ASSERT_FALSE(r.add(spec(Role::decode, "127.0.0.1:8201")).error);
  EXPECT_EQ(held->decode.size(), 1u) << "the held snapshot changed under its reader";
  EXPECT_EQ(held->by_id.size(), 3u);
  const InstanceSet* copied = r.snapshot().get();
  EXPECT_NE(copied, before);
  held.reset();

  ASSERT_FALSE(r.add(spec(Role::decode, "127.0.0.1:8202")).error);
  ASSERT_FALSE(r.drain(1, false).error);
  ASSERT_FALSE(r.undrain(1).error);
  ASSERT_FALSE(r.drain(2, true).error);  // idle: forgotten at once
  auto set = r.snapshot();
  EXPECT_EQ(set.get(), copied) << "changes with no reader copied the set";
  EXPECT_EQ(set->decode.size(), 3u);
  ASSERT_EQ(set->prefill.size(), 1u);
  EXPECT_EQ(set->prefill[0]->id, 1u);
  EXPECT_TRUE(set->draining.empty());
  EXPECT_EQ(set->find(2), nullptr);
  EXPECT_EQ(set->by_id.size(), 4u);

  // Held again: the next change copies, and the holder keeps its view.
  ASSERT_FALSE(r.drain(3, false).error);
  EXPECT_EQ(set->draining.size(), 0u);
  EXPECT_EQ(r.snapshot()->draining.size(), 1u);
  EXPECT_NE(r.snapshot().get(), set.get());
}

// Draining takes an instance out of the candidates but keeps it listed;
// removal waits for its last request; the outcome names the instance even
// when it was forgotten at once (the admin API's drain crash).
TEST(Registry, DrainThenRemoveWhenIdle) {
  Registry r(two_and_one());
  std::vector<std::string> changes;
  r.on_change = [&](const Instance& i, const std::string& state) {
    changes.push_back(std::to_string(i.id) + " " + state);
  };
  auto first = r.snapshot()->find(1);
  InFlightGuard busy(first);

  auto drained = r.drain(1, false);
  ASSERT_FALSE(drained.error);
  EXPECT_EQ(drained.instance, first);
  auto set = r.snapshot();
  EXPECT_EQ(set->prefill.size(), 1u);
  EXPECT_EQ(set->draining.size(), 1u);
  EXPECT_EQ(set->find(1)->state(), InstanceState::draining);

  auto removed = r.drain(1, true);
  ASSERT_FALSE(removed.error);
  EXPECT_EQ(r.forget_idle(), 0u) << "forgotten with a request in flight";
  EXPECT_NE(r.snapshot()->find(1), nullptr);
  busy = InFlightGuard();
  EXPECT_EQ(r.forget_idle(), 1u);
  EXPECT_EQ(r.snapshot()->find(1), nullptr);

  // An idle instance marked for removal is forgotten inside drain(): the
  // outcome still holds it.
  auto gone = r.drain(2, true);
  ASSERT_FALSE(gone.error);
  ASSERT_NE(gone.instance, nullptr);
  EXPECT_EQ(gone.instance->id, 2u);
  EXPECT_EQ(r.snapshot()->find(2), nullptr);

  auto missing = r.drain(2, false);
  ASSERT_TRUE(missing.error);
  EXPECT_EQ(status_of(*missing.error), 404u);
  EXPECT_FALSE(changes.empty());
}

// Undrain puts a draining instance back in its role list, in id order;
// one marked for removal cannot come back (409).
TEST(Registry, UndrainRestoresOrderUnlessRemoving) {
  Registry r(two_and_one());
  std::vector<std::string> changes;
  r.on_change = [&](const Instance& i, const std::string& state) {
    changes.push_back(std::to_string(i.id) + " " + state);
  };
  ASSERT_FALSE(r.drain(1, false).error);
  auto back = r.undrain(1);
  ASSERT_FALSE(back.error);
  auto set = r.snapshot();
  ASSERT_EQ(set->prefill.size(), 2u);
  EXPECT_EQ(set->prefill[0]->id, 1u);
  EXPECT_EQ(set->prefill[1]->id, 2u);
  EXPECT_TRUE(set->draining.empty());
  EXPECT_EQ(set->find(1)->state(), InstanceState::active);
  EXPECT_EQ(changes.back(), "1 active");

  auto busy = r.snapshot()->find(2);
  InFlightGuard g(busy);
  ASSERT_FALSE(r.drain(2, true).error);
  auto refused = r.undrain(2);
  ASSERT_TRUE(refused.error);
  EXPECT_EQ(status_of(*refused.error), 409u);
  EXPECT_EQ(status_of(*r.undrain(99).error), 404u);
}

// update() replaces labels and/or weight, bumps the version caches watch,
// and notifies only when something changed.
TEST(Registry, UpdateChangesLabelsAndWeight) {
  Registry r(two_and_one());
  int notified = 0;
  r.on_change = [&](const Instance&, const std::string& state) {
    ++notified;
    EXPECT_EQ(state, "active");
  };
  auto inst = r.snapshot()->find(3);
  const auto v0 = inst->meta_version();
  const auto old_labels = inst->labels();
  ASSERT_FALSE(r.update(3, Instance::Labels{{"tier", "gold"}}, std::nullopt).error);
  EXPECT_EQ(inst->labels()->at("tier"), "gold");
  EXPECT_TRUE(old_labels->empty()) << "a reader's snapshot changed under it";
  EXPECT_EQ(inst->weight(), 1u);
  EXPECT_GT(inst->meta_version(), v0);
  ASSERT_FALSE(r.update(3, std::nullopt, 9u).error);
  EXPECT_EQ(inst->weight(), 9u);
  EXPECT_EQ(inst->labels()->at("tier"), "gold");
  EXPECT_EQ(notified, 2);
  const auto v2 = inst->meta_version();
  ASSERT_FALSE(r.update(3, Instance::Labels{{"tier", "gold"}}, 9u).error);
  EXPECT_EQ(inst->meta_version(), v2);
  EXPECT_EQ(notified, 2) << "notified without a change";
  EXPECT_EQ(status_of(*r.update(42, std::nullopt, 2u).error), 404u);
}

}  // namespace
}  // namespace pdgate
