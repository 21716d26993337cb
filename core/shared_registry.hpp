// The instance set shared by gateway replicas through Redis (--redis).
// Every local change (add, drain, remove) is merged atomically into one
// JSON document (a Lua script: read, merge, write, bump a version,
// PUBLISH it); every replica polls the version often enough to converge
// within a second and applies what it has not seen. Removals are kept as
// tombstones so a late replica does not resurrect them. With Redis down,
// replicas keep serving with their last known set and retry.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "core/config.hpp"
#include "core/instance.hpp"
#include "core/result.hpp"

namespace pdgate {

class RedisConnection;
struct RedisConnectionsShared;

class SharedRegistry {
 public:
  SharedRegistry(const Config& cfg, Registry& registry);
  ~SharedRegistry();
  // Connects on `ex` and runs the sync loop until `ex` stops. Hooks the
  // registry's on_change.
  Result<bool> start(boost::asio::any_io_executor ex);

 private:
  boost::asio::awaitable<void> loop();
  void apply(const std::string& document);

  const Config& cfg_;
  Registry& registry_;
  std::unique_ptr<RedisConnectionsShared> shared_;
  std::shared_ptr<RedisConnection> conn_;
  std::mutex mu_;
  std::deque<std::pair<std::string, std::string>> pending_;  // field, entry JSON
  std::string seen_version_;
};

}  // namespace pdgate
