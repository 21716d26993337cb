// The shared registry's document (plugins/shared_registry.hpp) as a
// replica reads it: JSON written by whoever can write to Redis, so read
// without trusting it. Pure (no I/O), so that a fuzzer runs it on
// arbitrary bytes (tests/fuzz/fuzz_registry_document.cpp).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/config.hpp"
#include "core/upstream/instance_ids.hpp"

namespace pdgate {

// A replica never reads a document larger than this (it asks Redis for the
// size first), nor more entries than this of one.
inline constexpr std::size_t kMaxRegistryDocumentBytes = 16u << 20;
inline constexpr std::size_t kMaxRegistryDocumentEntries = 20'000;
inline constexpr std::size_t kMaxRegistryUrlBytes = 2048;

// One entry: an instance and its state ("active", "draining", "removed").
struct RegistryEntry {
  Role role = Role::decode;
  std::string url;
  std::string state;
  std::map<std::string, std::string> labels;
  unsigned weight = 1;
  // Data-parallel ranks (1..UpstreamSpec::kMaxDataParallelSize): one
  // entry per engine, each replica routes to its ranks.
  std::uint32_t dp_size = 1;
  // The cluster's id of rank 0 (core/upstream/instance_ids.hpp), 0 when
  // the entry has none (written by an older replica: asked
  // of Redis before the instance is added).
  std::uint64_t id = 0;
  // Set when the entry breaks a bound (labels past LabelLimits, as the
  // admin API holds them; a URL past kMaxRegistryUrlBytes, kept cut to
  // that length for the log): the entry is refused, its labels not kept.
  std::optional<std::string> refused;
};

struct RegistryDocument {
  // The entries read, in document order; at most
  // kMaxRegistryDocumentEntries. An entry of the wrong shape (not an
  // object, no role or URL, a weight outside 1..1000, a data_parallel_size
  // outside 1..UpstreamSpec::kMaxDataParallelSize) is skipped.
  std::vector<RegistryEntry> entries;
  // Entries past kMaxRegistryDocumentEntries, not read.
  std::size_t past_bound = 0;
  // Why the document could not be used at all (not a JSON object).
  std::optional<std::string> problem;
};

RegistryDocument parse_registry_document(std::string_view text);

// An id as Redis answers it (a decimal string): rank 0's id of an engine of
// `ranks` ranks, or 0 when it is not one (not digits, 0, or its ranks'
// ids reaching kLocalIdBase).
std::uint64_t parse_cluster_id(std::string_view text, std::uint32_t ranks);

}  // namespace pdgate
