// The KV connectors pdgate ships (core/routing/kv_connector.hpp): nixl,
// mooncake, p2p-nccl, lmcache, none, each a ConnectorForm. The composition
// root (main) picks one by name.
#pragma once

#include <memory>
#include <string_view>

#include "core/routing/kv_connector.hpp"

namespace pdgate {

struct KvConnectorOptions {
  NixlTransferMode nixl_mode = NixlTransferMode::automatic;  // --nixl-transfer-mode
  bool mooncake_parallel = true;                             // --mooncake-legs
};

// nixl | mooncake | p2p-nccl | lmcache | none; nullptr for another name.
std::unique_ptr<const KvConnector> make_kv_connector(std::string_view name,
                                                     KvConnectorOptions options = {});

}  // namespace pdgate
