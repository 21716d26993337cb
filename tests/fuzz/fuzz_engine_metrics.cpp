// An engine's /metrics page (policies/engine_metrics_text.cpp): scraped
// from every engine, so whatever the engine (or whatever answers on its
// port) sends must parse or be skipped without a crash or an over-read,
// for the whole engine and for one data-parallel rank's series, and every
// number parsed must be finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "policies/metrics.hpp"

namespace {

void check(const pdgate::policy::EngineMetrics& m) {
  for (const auto& v : {m.running, m.waiting, m.kv_usage}) {
    if (v && !std::isfinite(*v)) {
      std::fprintf(stderr, "invariant failed: a parsed metric is not finite\n");
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  check(pdgate::policy::parse_vllm_metrics(in));
  // The first byte picks the rank, so the filter sees every label shape.
  const std::uint32_t rank = size > 0 ? data[0] % 12 : 0;
  check(pdgate::policy::parse_vllm_metrics(in, rank));
  return 0;
}
