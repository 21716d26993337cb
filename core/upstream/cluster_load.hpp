// The load every gateway replica puts on each engine, shared so that
// replicas behind one load balancer route as one gateway would.
//
// Each replica reports, for every engine it has requests on, its in-flight
// requests and queued prompt tokens (Instance::in_flight, queued_tokens):
// a whole report each time, never a delta, so a lost or repeated report
// corrects itself with the next one. ClusterLoad keeps the latest report
// of every other replica, sums them per engine and writes the sums into
// the instances (Instance::others_in_flight, others_queued_tokens), where
// a pick reads them without locking. A replica whose reports stop (it
// died, or it or this one lost the transport) is forgotten after
// `expiry_ms`: its load stops counting, never haunts routing.
//
// Engines are named by InstanceKey (their URL), the same on every replica.
// Pure bookkeeping, no I/O: the transport (plugins/redis_load_sync.hpp)
// feeds it, from one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/routing/kv_location_index.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

struct LoadEntry {
  InstanceKey instance = 0;
  std::int64_t in_flight = 0;
  std::int64_t queued_tokens = 0;
  bool operator==(const LoadEntry&) const = default;
};

struct LoadReport {
  std::uint64_t origin = 0;  // the reporting replica (random per process)
  std::uint64_t seq = 0;     // grows with each report of that replica
  std::int64_t wall_ms = 0;  // when it was made, system clock (for lag only)
  std::vector<LoadEntry> entries;
};

struct ClusterLoadLimits {
  // Replicas tracked at once; reports from more are refused (counted).
  std::size_t max_replicas = 256;
  // Engines one report may name (beyond: the report is refused).
  std::size_t max_entries = 20'000;
  // A replica silent this long is forgotten.
  std::int64_t expiry_ms = 1'000;
};

// The key a replica's reports name an instance by.
InstanceKey load_key(const Instance& inst);

class ClusterLoad {
 public:
  explicit ClusterLoad(ClusterLoadLimits limits = {}) : limits_(limits) {}

  enum class Applied { applied, stale, too_many_replicas, too_many_entries, own };
  // The instances sums are written into: when `set` is not the one held
  // (instances were added, removed or replaced), it is indexed by key and
  // every sum written into it, zeros where nothing is known. Holding the
  // set keeps the registry from changing it in place.
  void use_instances(std::shared_ptr<const InstanceSet> set);
  // Replaces the report of `r.origin` with `r` (received at steady_now_ms)
  // and writes the changed sums into the instances.
  Applied apply(const LoadReport& r, std::uint64_t own_origin, std::int64_t steady_now_ms);
  // Forgets replicas silent past the expiry; returns how many.
  std::size_t expire(std::int64_t steady_now_ms);
  // Forgets every replica.
  void clear();

  // This replica's report on the instances in use: one entry per engine
  // URL with anything in flight or queued (instances of one URL in two
  // roles are one engine: summed), by key.
  LoadReport local_report(std::uint64_t origin, std::uint64_t seq, std::int64_t wall_ms) const;

  std::size_t replicas() const { return replicas_.size(); }
  // The replicas tracked with load on some engine whose origin comes
  // before `own_origin`: this replica's place in the order rechecks wait
  // in (core/upstream/replica_order.hpp).
  std::size_t busy_before(std::uint64_t own_origin) const;
  // The other replicas' sum for one engine (tests, admin).
  LoadEntry total(InstanceKey key) const;

 private:
  struct Replica {
    std::uint64_t seq = 0;
    std::int64_t seen_ms = 0;
    std::vector<LoadEntry> entries;
  };
  // Adds (sign 1) or removes (sign -1) a report's entries from the sums,
  // noting which engines changed.
  void account(const std::vector<LoadEntry>& entries, int sign);
  void write_changed();
  void write(InstanceKey key);
  void forget(std::unordered_map<std::uint64_t, Replica>::iterator it);

  ClusterLoadLimits limits_;
  std::shared_ptr<const InstanceSet> set_;
  // The instances in use by key, ordered so that reports are.
  std::map<InstanceKey, std::vector<const Instance*>> by_key_;
  std::unordered_map<std::uint64_t, Replica> replicas_;
  std::unordered_map<InstanceKey, LoadEntry> totals_;
  std::vector<InstanceKey> changed_;
};

}  // namespace pdgate
