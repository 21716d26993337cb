// The load reports replicas exchange (plugins/load_sync_wire.hpp).
#include "plugins/load_sync_wire.hpp"

#include <gtest/gtest.h>

namespace pdgate {
namespace {

TEST(LoadSyncWire, RoundTrips) {
  LoadReport r{42, 7, 1'700'000'000'000, {{11, 3, 4096}, {12, 0, 1}}};
  auto back = load_wire::decode(load_wire::encode(r));
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(back->origin, 42u);
  EXPECT_EQ(back->seq, 7u);
  EXPECT_EQ(back->wall_ms, 1'700'000'000'000);
  ASSERT_EQ(back->entries.size(), 2u);
  EXPECT_EQ(back->entries[0].instance, 11u);
  EXPECT_EQ(back->entries[0].in_flight, 3);
  EXPECT_EQ(back->entries[0].queued_tokens, 4096);
}

TEST(LoadSyncWire, RefusesWhatNoReplicaSends) {
  const std::string good = load_wire::encode({42, 1, 0, {{11, 1, 1}}});
  EXPECT_FALSE(load_wire::decode(""));
  EXPECT_FALSE(load_wire::decode("pdk1" + good.substr(4)));           // another record kind
  EXPECT_FALSE(load_wire::decode(good.substr(0, good.size() - 1)));   // truncated
  EXPECT_FALSE(load_wire::decode(good + "x"));                        // trailing bytes
  EXPECT_FALSE(load_wire::decode(load_wire::encode({0, 1, 0, {}})));  // no origin
  EXPECT_FALSE(load_wire::decode(load_wire::encode({1, 1, 0, {{0, 1, 1}}})));  // no engine
  EXPECT_FALSE(load_wire::decode(load_wire::encode({1, 1, 0, {{5, 1, 1}, {5, 1, 1}}})));
  // A count past the bound is refused before anything is allocated for it.
  std::string huge = good;
  huge[28] = '\xff';
  huge[29] = '\xff';
  huge[30] = '\xff';
  huge[31] = '\x7f';
  const auto r = load_wire::decode(huge);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("at most"), std::string::npos) << r.error();
  // An in-flight count past the bound.
  std::string many = good;
  many[32 + 8] = '\xff';
  many[32 + 9] = '\xff';
  many[32 + 10] = '\xff';
  many[32 + 11] = '\x7f';
  EXPECT_FALSE(load_wire::decode(many));
}

}  // namespace
}  // namespace pdgate
