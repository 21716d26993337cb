// The KV connectors pdgate ships (core/routing/kv_connector.hpp): nixl, p2p-nccl,
// lmcache, none. The composition root (main) picks one by name.
#pragma once

#include <memory>
#include <string_view>

#include "core/routing/kv_connector.hpp"

namespace pdgate {

// nixl | p2p-nccl | lmcache | none; nullptr for another name.
std::unique_ptr<const KvConnector> make_kv_connector(std::string_view name);

}  // namespace pdgate
