// W3C Trace Context (traceparent, tracestate) and W3C Baggage, as text:
// parsing what a client sent, bounding what is passed on, formatting what
// engines get, and the ids and sampling decisions of new traces. Pure
// functions and a seeded id source, unit-tested and fuzzed
// (tests/fuzz/fuzz_trace_context.cpp); the per-request use is in
// core/tracing.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/base/id_rng.hpp"

namespace pdgate {

using TraceId = std::array<std::uint8_t, 16>;
using SpanId = std::array<std::uint8_t, 8>;

// The header's parts. `flags` keeps every bit the client set; only bit 0
// (sampled) has a meaning in version 00.
struct TraceParent {
  TraceId trace_id{};
  SpanId parent_id{};
  std::uint8_t flags = 0;
  bool sampled() const { return (flags & 1) != 0; }
};

// "traceparent" is 55 characters in version 00.
inline constexpr std::size_t kTraceParentLength = 55;
// What is kept of a client's tracestate: the spec requires passing on at
// least 512 characters; longer values are cut at a list-member boundary.
inline constexpr std::size_t kMaxTraceState = 512;
// W3C Baggage's own limit on the whole header: longer baggage is dropped.
inline constexpr std::size_t kMaxBaggage = 8192;

// Parses a traceparent value as the spec's receiving rules say: version 00
// exactly ("00-" 32 lowercase hex "-" 16 lowercase hex "-" 2 lowercase
// hex), an all-zero trace or parent id invalid; a higher version (not ff)
// is read by its version-00 prefix when the next character, if any, is
// '-'. Anything else: nullopt (the caller starts a new trace).
std::optional<TraceParent> parse_traceparent(std::string_view text);

// "00-<trace id>-<span id>-<01|00>": what pdgate sends (always version 00,
// as the spec asks of a participant that changes the parent id).
std::string format_traceparent(const TraceId& trace, const SpanId& span, bool sampled);

// Lowercase hex of an id (OTLP/JSON encodes ids this way too).
std::string to_hex(const TraceId& id);
std::string to_hex(const SpanId& id);
bool is_zero(const TraceId& id);
bool is_zero(const SpanId& id);

// What is passed on of a client's tracestate: nullopt when it holds a
// character a header value cannot (control characters, non-ASCII); cut
// after the last complete list member within kMaxTraceState otherwise
// (empty when not even the first fits).
std::optional<std::string_view> bounded_tracestate(std::string_view text);
// What is passed on of a client's baggage: the value when it is printable
// ASCII and at most kMaxBaggage bytes, else nullopt (dropped whole: a cut
// member would change its meaning).
std::optional<std::string_view> bounded_baggage(std::string_view text);

// Whether a new trace is sampled at `ratio` (0..1), decided from the
// trace id's random low 8 bytes as OpenTelemetry's TraceIdRatioBased
// sampler does, so every participant that samples by ratio agrees.
bool sampled_at_ratio(const TraceId& id, double ratio);

// Random trace and span ids for one worker: seeded once from the OS, then
// a PRNG (a getrandom call per id would cost a system call per span).
// Never returns an all-zero id (invalid in the spec).
class TraceIdSource {
 public:
  TraceIdSource() = default;
  explicit TraceIdSource(std::uint64_t seed) : rng_(seed) {}
  TraceId trace_id();
  SpanId span_id();

 private:
  IdRng rng_;
};

}  // namespace pdgate
