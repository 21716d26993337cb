#include "core/observability/trace_context.hpp"

#include "core/base/hex.hpp"

#include <cstring>

namespace pdgate {

namespace {

// The value of a lowercase hex digit, -1 otherwise (the spec allows no
// uppercase).
// W3C trace context ids are lowercase hex only.
int lower_hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

template <std::size_t N>
bool parse_hex(std::string_view text, std::array<std::uint8_t, N>& out) {
  if (text.size() != 2 * N)
    return false;
  for (std::size_t i = 0; i < N; ++i) {
    const int hi = lower_hex_value(text[2 * i]);
    const int lo = lower_hex_value(text[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return false;
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return true;
}

// Written in place after one resize: appending a character at a time
// checked the capacity 2N times (a traceparent is made for every request
// and every stage).
template <std::size_t N>
void append_hex(std::string& out, const std::array<std::uint8_t, N>& id) {
  const std::size_t at = out.size();
  out.resize(at + 2 * N);
  hex_encode(id.data(), N, out.data() + at);
}

template <std::size_t N>
bool all_zero(const std::array<std::uint8_t, N>& id) {
  for (std::uint8_t b : id) {
    if (b != 0)
      return false;
  }
  return true;
}

// Visible ASCII, space and tab: what a header value may hold without
// escaping (no CR, LF, NUL, DEL or bytes above 0x7e).
bool printable(std::string_view text) {
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && u != '\t') || u > 0x7e)
      return false;
  }
  return true;
}

template <std::size_t N>
void fill(IdRng& rng, std::array<std::uint8_t, N>& id) {
  do {
    for (std::size_t i = 0; i < N; i += 8) {
      const std::uint64_t r = rng();
      std::memcpy(id.data() + i, &r, std::min<std::size_t>(8, N - i));
    }
  } while (all_zero(id));
}

}  // namespace

std::optional<TraceParent> parse_traceparent(std::string_view text) {
  if (text.size() < kTraceParentLength)
    return std::nullopt;
  std::array<std::uint8_t, 1> version{};
  if (!parse_hex(text.substr(0, 2), version) || version[0] == 0xff)
    return std::nullopt;
  if (version[0] == 0) {
    if (text.size() != kTraceParentLength)
      return std::nullopt;
  } else if (text.size() > kTraceParentLength && text[kTraceParentLength] != '-') {
    return std::nullopt;
  }
  if (text[2] != '-' || text[35] != '-' || text[52] != '-')
    return std::nullopt;
  TraceParent p;
  std::array<std::uint8_t, 1> flags{};
  if (!parse_hex(text.substr(3, 32), p.trace_id) || !parse_hex(text.substr(36, 16), p.parent_id) ||
      !parse_hex(text.substr(53, 2), flags)) {
    return std::nullopt;
  }
  if (all_zero(p.trace_id) || all_zero(p.parent_id))
    return std::nullopt;
  p.flags = flags[0];
  return p;
}

std::string format_traceparent(const TraceId& trace, const SpanId& span, bool sampled) {
  std::string out;
  out.reserve(kTraceParentLength);
  out += "00-";
  append_hex(out, trace);
  out += '-';
  append_hex(out, span);
  out += sampled ? "-01" : "-00";
  return out;
}

std::string to_hex(const TraceId& id) {
  std::string out;
  out.reserve(32);
  append_hex(out, id);
  return out;
}

std::string to_hex(const SpanId& id) {
  std::string out;
  out.reserve(16);
  append_hex(out, id);
  return out;
}

bool is_zero(const TraceId& id) {
  return all_zero(id);
}

bool is_zero(const SpanId& id) {
  return all_zero(id);
}

std::optional<std::string_view> bounded_tracestate(std::string_view text) {
  if (!printable(text))
    return std::nullopt;
  if (text.size() <= kMaxTraceState)
    return text;
  // The last member boundary that keeps the value within the bound.
  const std::size_t comma = text.substr(0, kMaxTraceState + 1).rfind(',');
  if (comma == std::string_view::npos)
    return text.substr(0, 0);
  std::string_view kept = text.substr(0, comma);
  while (!kept.empty() && (kept.back() == ' ' || kept.back() == '\t'))
    kept.remove_suffix(1);
  return kept;
}

std::optional<std::string_view> bounded_baggage(std::string_view text) {
  if (text.size() > kMaxBaggage || !printable(text))
    return std::nullopt;
  return text;
}

bool sampled_at_ratio(const TraceId& id, double ratio) {
  if (!(ratio > 0.0))
    return false;
  if (ratio >= 1.0)
    return true;
  std::uint64_t low = 0;
  for (std::size_t i = 8; i < 16; ++i)
    low = low << 8 | id[i];
  // Compared on the top 53 bits, the precision of a double.
  const auto bound = static_cast<std::uint64_t>(ratio * 9007199254740992.0);  // 2^53
  return (low >> 11) < bound;
}

TraceId TraceIdSource::trace_id() {
  TraceId id;
  fill(rng_, id);
  return id;
}

SpanId TraceIdSource::span_id() {
  SpanId id;
  fill(rng_, id);
  return id;
}

}  // namespace pdgate
