#include "plugins/load_sync_wire.hpp"

#include <algorithm>
#include <cstring>

#include "plugins/wire_bytes.hpp"

namespace pdgate::load_wire {
namespace {

constexpr char kMagic[4] = {'p', 'd', 'l', '1'};

}  // namespace

std::string encode(const LoadReport& r) {
  std::string out;
  const std::size_t n = std::min(r.entries.size(), kMaxEntries);
  out.reserve(kHeaderBytes + kEntryBytes * n);
  out.append(kMagic, sizeof kMagic);
  wire::put<std::uint64_t>(out, r.origin);
  wire::put<std::uint64_t>(out, r.seq);
  wire::put<std::int64_t>(out, r.wall_ms);
  wire::put<std::uint32_t>(out, static_cast<std::uint32_t>(n));
  for (std::size_t i = 0; i < n; ++i) {
    const LoadEntry& e = r.entries[i];
    wire::put<std::uint64_t>(out, e.instance);
    wire::put<std::uint32_t>(
        out, static_cast<std::uint32_t>(std::clamp<std::int64_t>(e.in_flight, 0, kMaxInFlight)));
    wire::put<std::uint64_t>(out, static_cast<std::uint64_t>(std::clamp<std::int64_t>(
                                      e.queued_tokens, 0, kMaxQueuedTokens)));
  }
  return out;
}

Result<LoadReport> decode(std::string_view bytes) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return fail("not a load report");
  wire::Reader in(bytes.substr(sizeof kMagic));
  LoadReport r;
  r.origin = in.get<std::uint64_t>();
  r.seq = in.get<std::uint64_t>();
  r.wall_ms = in.get<std::int64_t>();
  const std::uint32_t n = in.get<std::uint32_t>();
  if (n > kMaxEntries)
    return fail("load report names " + std::to_string(n) + " engines (at most " +
                std::to_string(kMaxEntries) + ")");
  if (in.left() != std::size_t{n} * kEntryBytes)
    return fail("load report of " + std::to_string(n) + " entries has " +
                std::to_string(in.left()) + " bytes of entries");
  if (r.origin == 0)
    return fail("load report without an origin");
  r.entries.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    LoadEntry e;
    e.instance = in.get<std::uint64_t>();
    e.in_flight = in.get<std::uint32_t>();
    const std::uint64_t q = in.get<std::uint64_t>();
    if (e.instance == 0)
      return fail("load report entry without an instance");
    if (e.in_flight > kMaxInFlight || q > static_cast<std::uint64_t>(kMaxQueuedTokens))
      return fail("load report entry out of bounds");
    e.queued_tokens = static_cast<std::int64_t>(q);
    r.entries.push_back(e);
  }
  // An engine named twice would be counted twice.
  std::vector<InstanceKey> keys;
  keys.reserve(n);
  for (const auto& e : r.entries)
    keys.push_back(e.instance);
  std::sort(keys.begin(), keys.end());
  if (std::adjacent_find(keys.begin(), keys.end()) != keys.end())
    return fail("load report names an engine twice");
  return r;
}

}  // namespace pdgate::load_wire
