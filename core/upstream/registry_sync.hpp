// Sharing the instance registry with other gateway replicas. The gateway
// only starts it; the implementation (plugins/shared_registry.*, through
// Redis) is chosen by the composition root (app/main.cpp), so core needs
// no storage client.
#pragma once

#include <functional>
#include <memory>

#include <boost/asio/any_io_executor.hpp>

#include "core/base/result.hpp"
#include "core/config/config.hpp"

namespace pdgate {

class Registry;
class LoopGuard;

class RegistrySync {
 public:
  virtual ~RegistrySync() = default;
  // Connects on `ex` and keeps the registry in step with the other
  // replicas until `ex` stops; hooks the registry's on_change. An error
  // leaves the gateway serving with its own registry.
  virtual Result<bool> start(boost::asio::any_io_executor ex) = 0;
};

// Makes the gateway's RegistrySync, or nullptr when the configuration
// shares nothing. `loop_guard` (the gateway's Via identity, for validating
// instances learnt from other replicas) outlives it.
using RegistrySyncFactory = std::function<std::unique_ptr<RegistrySync>(
    const Config& cfg, Registry& registry, const LoopGuard& loop_guard)>;

}  // namespace pdgate
