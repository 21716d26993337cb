// Keeps the KV-event subscriptions in step with the registry: instances
// added at run time (admin API) with an event endpoint are subscribed,
// removed ones dropped. Like the KV-location purge, the registry's
// snapshot is compared on a slow timer rather than hooking every path
// that changes it.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "core/routing/kv_events.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

// The subscriptions `set` asks for: its instances with an event endpoint.
std::vector<KvEventSubscription> kv_event_subscriptions(const InstanceSet& set);

// Hands `ingest` the registry's subscriptions every `interval` on `ioc`
// (only when the registry changed) until `ioc` stops.
void start_kv_event_follow(boost::asio::io_context& ioc, const Registry& registry,
                           std::shared_ptr<KvEventIngest> ingest,
                           std::chrono::milliseconds interval);

}  // namespace pdgate
