// The client's trace headers are untrusted bytes. Whatever they are:
// parse_traceparent accepts only what it can format back (version 00
// round-trips exactly, other versions by their prefix); what is passed on
// of tracestate and baggage is a bounded prefix with no control bytes.
// The input is split at its first NUL: traceparent, then the other two.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "core/observability/trace_context.hpp"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant failed: %s\n", what);
    std::abort();
  }
}

bool header_safe(std::string_view v) {
  for (char c : v) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u > 0x7e)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string_view tp = input.substr(0, nul);
  const std::string_view rest = nul == std::string_view::npos ? "" : input.substr(nul + 1);

  if (const auto p = pdgate::parse_traceparent(tp)) {
    check(!pdgate::is_zero(p->trace_id) && !pdgate::is_zero(p->parent_id), "zero id accepted");
    const std::string again = pdgate::format_traceparent(p->trace_id, p->parent_id, p->sampled());
    check(again.size() == pdgate::kTraceParentLength, "formatted length");
    const auto q = pdgate::parse_traceparent(again);
    check(q && q->trace_id == p->trace_id && q->parent_id == p->parent_id &&
              q->sampled() == p->sampled(),
          "format does not parse back to the same context");
    if (tp.starts_with("00"))
      check(tp.substr(3, 49) == std::string_view(again).substr(3, 49), "version 00 ids changed");
  }

  if (const auto ts = pdgate::bounded_tracestate(rest)) {
    check(ts->size() <= pdgate::kMaxTraceState, "tracestate over its bound");
    check(rest.substr(0, ts->size()) == *ts, "tracestate is not a prefix");
    check(header_safe(*ts), "tracestate holds a control byte");
  } else {
    check(!header_safe(rest), "a printable tracestate was dropped");
  }
  if (const auto b = pdgate::bounded_baggage(rest)) {
    check(b->size() <= pdgate::kMaxBaggage && *b == rest, "baggage changed or over its bound");
    check(header_safe(*b), "baggage holds a control byte");
  }
  const pdgate::TraceId id = pdgate::TraceIdSource(size).trace_id();
  check(pdgate::sampled_at_ratio(id, 1.0) && !pdgate::sampled_at_ratio(id, 0.0), "ratio bounds");
  return 0;
}
