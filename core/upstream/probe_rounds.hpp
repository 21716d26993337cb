// Periodic probes of every instance (active health checks, engine-metrics
// scrapes) with bounded concurrency, spread over their interval: with
// thousands of instances a round must neither open thousands of
// connections in one instant nor let slow rounds pile up on each other.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "core/upstream/instance.hpp"

namespace pdgate {

struct ProbeRounds {
  // The instances to probe, asked again at the start of every round.
  std::function<std::vector<InstancePtr>()> instances;
  // One probe; it must end on its own within a bounded time (its own
  // timeout). Exceptions are swallowed: they free the probe's slot.
  std::function<boost::asio::awaitable<void>(InstancePtr)> probe;
  std::chrono::milliseconds interval{1000};
  // Probes in flight at most, across rounds.
  std::size_t max_concurrency = 64;
};

// Where in each interval an instance is probed: the fractional part of
// id x golden ratio, so the offsets of any set of instances are evenly
// spread, and an instance keeps its offset whatever others come and go.
std::chrono::milliseconds probe_offset(std::uint64_t id, std::chrono::milliseconds interval);

// Runs rounds until the executor stops. A round starts every interval;
// each instance is probed at its offset into the round, or as soon after
// as a slot is free (in the first round, as soon as a slot is free). A
// round that cannot finish within its interval (too few slots for slow
// probes) delays the next, which starts once every probe of the round has
// ended: there is never more than one round, and never more than
// max_concurrency probes, in flight. Must run on a single-threaded
// executor (its bookkeeping is not locked).
boost::asio::awaitable<void> run_probe_rounds(ProbeRounds rounds);

}  // namespace pdgate
