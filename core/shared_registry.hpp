// The instance set shared by gateway replicas through Redis (--redis).
// Every local change (add, drain, remove) is merged atomically into one
// JSON document (a Lua script: read, merge, write, bump a version,
// PUBLISH it); every replica is SUBSCRIBEd to the channel and reloads the
// document as soon as a message arrives. A slow periodic version check
// (and a full reload after every re-subscribe) catches messages lost
// while disconnected. Removals are kept as tombstones so a late replica
// does not resurrect them. With Redis down, replicas keep serving with
// their last known set; their own changes stay queued and are written
// when Redis is back.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

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
  // `announce`: written only if Redis has no entry for the instance yet
  // (what a replica serves from its flags, or refills an empty Redis with,
  // never overrides a change made through the admin API).
  void queue(const Instance& i, const std::string& state, bool announce = false);
  // Runs the loop now rather than at its next tick (executor thread only).
  void wake(bool reload);

  const Config& cfg_;
  Registry& registry_;
  std::unique_ptr<RedisConnectionsShared> shared_;
  boost::asio::any_io_executor ex_;
  std::shared_ptr<RedisConnection> conn_;
  std::shared_ptr<RedisConnection> subscriber_;
  std::mutex mu_;
  struct Change {
    std::string field;  // role|url
    std::string entry;  // JSON
    bool announce = false;
    bool operator==(const Change&) const = default;
  };
  std::deque<Change> pending_;
  // Loop state, touched on ex_ only.
  std::string seen_version_;
  bool woken_ = false;
  bool reload_ = false;                         // reload the document whatever its version says
  boost::asio::steady_timer* sleep_ = nullptr;  // the loop's timer while it waits
};

}  // namespace pdgate
