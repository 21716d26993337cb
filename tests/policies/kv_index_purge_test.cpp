// Instances leaving the registry are forgotten by the KV-location index.
#include <gtest/gtest.h>

#include "policies/kv_index_purge.hpp"
#include "policies/local_kv_index.hpp"

namespace pdgate::policy {
namespace {

InstancePtr make(std::uint64_t id, const std::string& url) {
  UpstreamSpec spec;
  spec.role = Role::prefill;
  spec.url = url;
  return std::make_shared<Instance>(id, spec);
}

// A sweep after an instance left makes the index stop matching it; the one that stayed
// keeps its routes, and a second sweep forgets nothing more.
TEST(InstancePurger, ForgetsRemovedInstances) {
  LocalKvIndex index(1 << 12, 600'000);
  const auto a = make(1, "http://10.0.0.1:8100"), b = make(2, "http://10.0.0.2:8100");
  InstanceSet both;
  both.by_id = {a, b};
  InstancePurger purger;
  EXPECT_EQ(purger.sweep(both, index, 10), 0u);
  index.record_prefix({1, 2}, instance_key(a->spec.url), 20);
  index.record_prefix({1, 2}, instance_key(b->spec.url), 20);
  InstanceSet only_b;
  only_b.by_id = {b};
  EXPECT_EQ(purger.sweep(only_b, index, 30), 1u);
  const auto m = index.prefix_matches({1, 2}, 40, 8);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].first, instance_key(b->spec.url));
  EXPECT_EQ(purger.sweep(only_b, index, 50), 0u);
}

}  // namespace
}  // namespace pdgate::policy
