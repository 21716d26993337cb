// The load reports replicas exchange (plugins/load_sync_wire.cpp): they
// come from Redis, which anyone who can write to it controls. Any bytes
// must decode or be refused without a crash, an over-read or an
// allocation larger than the input justifies; a report that decodes must
// encode back to the same bytes, and applying it then forgetting it must
// leave no load behind.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "plugins/load_sync_wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto r = pdgate::load_wire::decode(in);
  if (!r)
    return 0;
  if (pdgate::load_wire::encode(*r) != in) {
    std::fprintf(stderr, "invariant failed: re-encoded report differs from its input\n");
    std::abort();
  }
  pdgate::ClusterLoad cluster;
  cluster.apply(*r, 0, 0);
  cluster.clear();
  for (const auto& e : r->entries) {
    const auto t = cluster.total(e.instance);
    if (t.in_flight != 0 || t.queued_tokens != 0) {
      std::fprintf(stderr, "invariant failed: load left after the replica was forgotten\n");
      std::abort();
    }
  }
  return 0;
}
