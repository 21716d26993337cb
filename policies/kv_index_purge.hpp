// Keeps the KV-location index honest about instances that left: a removed
// engine's cache is gone with it (and a later one at the same URL starts
// empty), so its routes must stop counting. Removals reach the registry
// from the admin API, the shared registry or a drain; rather than hook
// each, the registry's snapshot is compared with the previous one on a
// slow timer.
#pragma once

#include <chrono>
#include <memory>
#include <unordered_set>

#include <boost/asio/io_context.hpp>

#include "core/routing/kv_location_index.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate::policy {

class InstancePurger {
 public:
  // Forgets, in `index`, every instance of the previous sweep's set that
  // is not in `set` any more. Returns how many.
  std::size_t sweep(const InstanceSet& set, KvLocationIndex& index, std::int64_t now_ms);

 private:
  std::unordered_set<InstanceKey> known_;
};

// Sweeps every `interval` on `ioc` (which one thread runs) until it stops.
void start_kv_index_purge(boost::asio::io_context& ioc, const Registry& registry,
                          std::shared_ptr<KvLocationIndex> index,
                          std::chrono::milliseconds interval);

}  // namespace pdgate::policy
