// Fault injection: what --error-rate, --hang and --die-after-chunks, and a
// request's X-Sim-Fault header (parsed in options.hpp), make the sim do
// instead of its normal work, so tests can see how pdgate copes with an
// engine that fails, hangs or dies mid-stream. Every fault that fires is
// counted in sim:faults_total.
#pragma once

#include <random>

#include "sim/http_exchange.hpp"
#include "sim/metrics.hpp"
#include "sim/options.hpp"

namespace pdgate::sim {

// The faults decided per request, before any work is done.
class Faults {
 public:
  // `rng` is the engine's one seeded RNG: the draws for --error-rate and the
  // ids it generates come from one sequence, so --seed replays both.
  Faults(const SimOptions& opts, std::mt19937_64& rng, Counters& counters)
      : opts_(opts), rng_(rng), counters_(counters) {}

  // --hang: reads the request and never answers, until the client leaves.
  // Returns whether the connection stays open.
  awaitable<bool> hang(Exchange& x);

  // A generation request's faults: X-Sim-Fault delay-ms, hang and error,
  // --error-rate; on a stream, arms die-after and error-after for
  // fire_stream_faults(). Returns whether the request goes on to be
  // served; false when a fault answered it or the client left.
  awaitable<bool> before_work(Exchange& x, const Fault& fault, bool stream);

 private:
  const SimOptions& opts_;
  std::mt19937_64& rng_;
  Counters& counters_;
};

// Called after the stream headers and after each data event: once the
// armed die-after or error-after is due, fires it. Returns whether the
// stream goes on.
awaitable<bool> fire_stream_faults(Exchange& x);

}  // namespace pdgate::sim
