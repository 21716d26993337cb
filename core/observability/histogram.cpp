// Histogram's constructor in a file of its own: every Instance holds
// histograms, and code that links only the instance table (the policy
// sandbox's fuzz target) constructs them without the rest of metrics.cpp.
#include <cassert>

#include "core/observability/metrics.hpp"

namespace pdgate {

Histogram::Histogram(std::span<const double> bounds) : bounds_(bounds) {
  assert(bounds.size() <= kMaxBounds);
}

}  // namespace pdgate
