// Which instances the KV-event ingestion follows: those of the registry's
// snapshot that have an event endpoint.
#include <gtest/gtest.h>

#include "core/upstream/kv_event_follow.hpp"

namespace pdgate {
namespace {

InstancePtr instance(std::uint64_t id, const std::string& url, const std::string& endpoint) {
  UpstreamSpec spec;
  spec.url = url;
  spec.kv_events.endpoint = endpoint;
  if (!endpoint.empty())
    spec.kv_events.replay = endpoint + "9";
  return std::make_shared<Instance>(id, spec);
}

// Only instances with an event endpoint are subscribed, keyed as the KV-location index keys them.
TEST(KvEventFollow, SubscribesInstancesWithEndpoints) {
  InstanceSet set;
  set.by_id = {instance(1, "http://a:1", "tcp://a:5557"), instance(2, "http://b:1", ""),
               instance(3, "http://c:1", "tcp://c:5557")};
  const auto subs = kv_event_subscriptions(set);
  ASSERT_EQ(subs.size(), 2u);
  EXPECT_EQ(subs[0].key, instance_key("http://a:1"));
  EXPECT_EQ(subs[0].instance_url, "http://a:1");
  EXPECT_EQ(subs[0].endpoint.endpoint, "tcp://a:5557");
  EXPECT_EQ(subs[0].endpoint.replay, "tcp://a:55579");
  EXPECT_EQ(subs[1].key, instance_key("http://c:1"));
}

}  // namespace
}  // namespace pdgate
