// Instance ids, kept apart from the registry (core/upstream/instance.hpp)
// so that what only reads or checks an id (the shared registry's document
// parser, its fuzzer) needs no more than the configuration.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "core/config/config.hpp"

namespace pdgate {

// Instance ids. Without a shared registry (--redis) a replica numbers its
// instances 1, 2, ... in the order it lists them, the config's first. With
// one, ids are the cluster's: Redis hands one out per engine (role, URL
// and data-parallel size: cluster_id_key) the first time any replica
// lists it, and every replica, started later or restarted, uses that one
// (plugins/shared_registry.hpp); a data-parallel engine's ranks take
// consecutive ids. Cluster ids stay below kLocalIdBase; an engine a
// replica lists while Redis cannot be asked is numbered from kLocalIdBase
// on, so that its id never names another engine elsewhere.
inline constexpr std::uint64_t kLocalIdBase = std::uint64_t{1} << 40;
// What Redis keeps an engine's id under: "role|url", and "|dp=N" after it
// for N data-parallel ranks (a resized engine is another range of ids).
std::string cluster_id_key(Role role, const std::string& url, std::uint32_t dp_size);
// Rank 0's id of engines, by cluster_id_key.
using ClusterIds = std::unordered_map<std::string, std::uint64_t>;

// An engine whose cluster-wide id is asked for.
struct IdRequest {
  Role role = Role::decode;
  std::string url;
  std::uint32_t dp_size = 1;
};

}  // namespace pdgate
