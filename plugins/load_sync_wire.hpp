// The load reports gateway replicas exchange (plugins/redis_load_sync.hpp):
// pure functions, unit-tested and fuzzed without a socket.
//
// A report is one PUBLISH payload, little-endian binary:
//   "pdl1" | origin:u64 | seq:u64 | wall_ms:i64 | n:u32 | entry * n
//   entry := instance:u64 | in_flight:u32 | queued_tokens:u64
// Every figure is bounded (a report naming more engines than a registry
// holds, a count no gateway could reach, an instance key of 0 or twice in
// one report are refused whole): a report is another process's word, read
// like an admin call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/base/result.hpp"
#include "core/upstream/cluster_load.hpp"

namespace pdgate::load_wire {

inline constexpr std::size_t kHeaderBytes = 32;
inline constexpr std::size_t kEntryBytes = 20;
inline constexpr std::size_t kMaxEntries = 20'000;
// More requests than any gateway holds on one engine (its connection
// bound is far lower), and more queued tokens than any engine could hold.
inline constexpr std::int64_t kMaxInFlight = 10'000'000;
inline constexpr std::int64_t kMaxQueuedTokens = std::int64_t{1} << 40;

std::string encode(const LoadReport& r);
Result<LoadReport> decode(std::string_view bytes);

}  // namespace pdgate::load_wire
