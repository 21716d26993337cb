// A reload's instance lists against the running registry
// (core/gateway/config_reload.*): what is added, drained and kept, under which id.
#include "core/gateway/config_reload.hpp"

#include <gtest/gtest.h>

namespace pdgate {
namespace {

Config with_decodes(std::vector<std::string> hostports) {
  Config c;
  for (const auto& hp : hostports) {
    auto s = parse_upstream(Role::decode, hp);
    EXPECT_TRUE(s) << s.error();
    c.decode.push_back(*s);
  }
  return c;
}

std::vector<std::string> active_decodes(const Registry& r) {
  std::vector<std::string> out;
  for (const auto& i : r.snapshot()->decode)
    out.push_back(i->spec.url);
  return out;
}

// An entry only the new list has is added, one only the old list had is
// drained and forgotten (nothing in flight), one both list keeps its id.
TEST(ReconcileInstances, AddsDrainsAndKeepsIds) {
  const Config before = with_decodes({"h:1", "h:2"});
  Registry r(before);
  const auto kept_id = r.find(Role::decode, "http://h:1")->id;
  const Config after = with_decodes({"h:1", "h:3"});
  const auto changes = reconcile_instances(r, before, after);
  EXPECT_EQ(active_decodes(r), (std::vector<std::string>{"http://h:1", "http://h:3"}));
  EXPECT_EQ(r.find(Role::decode, "http://h:1")->id, kept_id);
  EXPECT_EQ(r.find(Role::decode, "http://h:2"), nullptr) << "idle: forgotten at once";
  EXPECT_EQ(changes.lines.size(), 2u);
}

// A removed instance with a request in flight drains (no new requests)
// and stays listed until the request ends.
TEST(ReconcileInstances, RemovedInstanceFinishesInFlight) {
  const Config before = with_decodes({"h:1", "h:2"});
  Registry r(before);
  auto busy = r.find(Role::decode, "http://h:2");
  {
    InFlightGuard request(busy);
    reconcile_instances(r, before, with_decodes({"h:1"}));
    EXPECT_EQ(active_decodes(r), std::vector<std::string>{"http://h:1"});
    EXPECT_EQ(busy->state(), InstanceState::draining);
    EXPECT_NE(r.snapshot()->find(busy->id), nullptr);
  }
  r.forget_idle();
  EXPECT_EQ(r.snapshot()->find(busy->id), nullptr);
}

// Labels and weight given in the file follow an edit in place, under the
// same id (policies and metric series see one instance).
TEST(ReconcileInstances, LabelsAndWeightUpdatedInPlace) {
  const Config before = with_decodes({"h:1"});
  Registry r(before);
  const auto inst = r.find(Role::decode, "http://h:1");
  Config after = before;
  after.decode[0].labels = {{"tier", "gold"}};
  after.decode[0].weight = 4;
  reconcile_instances(r, before, after);
  EXPECT_EQ(r.find(Role::decode, "http://h:1"), inst);
  EXPECT_EQ(inst->labels()->at("tier"), "gold");
  EXPECT_EQ(inst->weight(), 4u);
}

// Instances added at run time (admin API) are not the file's: a reload
// that does not list them leaves them serving.
TEST(ReconcileInstances, RuntimeAddedInstancesStay) {
  const Config before = with_decodes({"h:1"});
  Registry r(before);
  ASSERT_TRUE(r.add(*parse_upstream(Role::decode, "h:9")).instance);
  reconcile_instances(r, before, with_decodes({"h:1", "h:2"}));
  EXPECT_EQ(active_decodes(r),
            (std::vector<std::string>{"http://h:1", "http://h:9", "http://h:2"}));
}

// An instance drained by hand (admin API) that the new file still lists
// goes back into service under its id; one still being removed is not
// re-added twice.
TEST(ReconcileInstances, ListedAgainComesBack) {
  const Config before = with_decodes({"h:1", "h:2"});
  Registry r(before);
  const auto inst = r.find(Role::decode, "http://h:2");
  ASSERT_FALSE(r.drain(inst->id, false).error);
  reconcile_instances(r, before, before);
  EXPECT_EQ(inst->state(), InstanceState::active);
  EXPECT_EQ(active_decodes(r), (std::vector<std::string>{"http://h:1", "http://h:2"}));

  InFlightGuard request(inst);
  reconcile_instances(r, before, with_decodes({"h:1"}));  // removed, still busy
  const auto changes = reconcile_instances(r, with_decodes({"h:1"}), before);
  EXPECT_EQ(active_decodes(r), std::vector<std::string>{"http://h:1"});
  ASSERT_EQ(changes.lines.size(), 1u);
  EXPECT_NE(changes.lines[0].find("still being removed"), std::string::npos) << changes.lines[0];
}

}  // namespace
}  // namespace pdgate
