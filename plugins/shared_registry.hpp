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
//
// An instance learnt from the document passes the same validation as an
// admin add (core/upstream/upstream_validator.hpp: --allowed-upstreams, the
// routing-loop probe, --model) before it is used: anyone who can write to
// Redis could otherwise point every replica at an internal service.
// Validation is asynchronous, at most --health-max-concurrency at a time,
// and only for instances new to this replica; a refused one is logged (at most once a second),
// counted (Registry::shared_refused_total) and tried again at the next document change.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "core/base/result.hpp"
#include "core/config/config.hpp"
#include "core/net/loop_guard.hpp"
#include "core/upstream/instance.hpp"
#include "core/upstream/registry_sync.hpp"
#include "core/upstream/upstream_validator.hpp"
#include "plugins/redis_client_context.hpp"

namespace pdgate {

class RedisConnection;
struct RedisConnectionsShared;

class SharedRegistry final : public RegistrySync {
 public:
  // How long a removal ("removed", a tombstone) stands in the document:
  // meanwhile a replica that still lists the instance cannot bring it
  // back; afterwards the next write drops it (docs/operations.md).
  static constexpr std::chrono::seconds kTombstoneTtl{300};

  // `loop_guard` (this gateway's Via identity, for the validation probe)
  // must outlive it; `engine_tls` reaches https:// instances; `redis`
  // secures rediss:// and counts the connections' state.
  SharedRegistry(const Config& cfg, Registry& registry, const LoopGuard& loop_guard,
                 std::shared_ptr<const EngineTls> engine_tls = nullptr,
                 RedisClientContext redis = {});
  ~SharedRegistry();
  // Connects on `ex` and runs the sync loop until `ex` stops. Hooks the
  // registry's on_change and makes Redis its source of ids.
  Result<bool> start(boost::asio::any_io_executor ex) override;

  // The cluster's ids of the engines `cfg` lists (the ids Redis keeps,
  // given out now to those it has none for), by cluster_id_key, for the
  // registry to be made with. Blocks for at most about 2 x `budget`:
  // call before serving, never on an event loop. An engine Redis did not
  // answer for in time is missing (the registry numbers it locally).
  static ClusterIds config_ids(const Config& cfg, RedisClientContext redis,
                               std::chrono::milliseconds budget = std::chrono::seconds(1));

 private:
  boost::asio::awaitable<void> loop();
  void apply(const std::string& document);
  // An active instance of the document this replica does not have.
  struct Learnt {
    std::string key;  // role|url
    NewInstance instance;
  };
  // Validates `fresh` (or adds it at once when there is nothing to check).
  void learn(std::vector<Learnt> fresh);
  // One validation slot: validates queued instances until none is left.
  boost::asio::awaitable<void> validate_queued();
  // Adds the instances that passed and are still wanted, as one batch.
  void add_passed();
  // `used`: the instance is served all the same (under a local id).
  void log_refusal(std::string_view role, std::string_view url, std::string_view why,
                   bool used = false);
  // A document that could not be read or used whole: counted
  // (Registry::note_shared_document_error), logged at most once a second.
  void report_document(const std::string& why);
  // `announce`: written only if Redis has no entry for the instance yet
  // (what a replica serves from its flags, or refills an empty Redis with,
  // never overrides a change made through the admin API).
  void queue(const Instance& i, const std::string& state, bool announce = false);
  // Runs the loop now rather than at its next tick (executor thread only).
  void wake(bool reload);

  const Config& cfg_;
  Registry& registry_;
  const LoopGuard& loop_guard_;
  std::shared_ptr<const EngineTls> engine_tls_;
  const RedisClientContext redis_;
  std::unique_ptr<RedisConnectionsShared> shared_;
  boost::asio::any_io_executor ex_;
  std::shared_ptr<RedisConnection> conn_;
  std::shared_ptr<RedisConnection> subscriber_;
  std::mutex mu_;
  struct Change {
    std::string field;  // role|url
    std::string entry;  // JSON
    bool announce = false;
    bool added = false;  // an add: replaces a removal's tombstone
    std::string id_key;  // cluster_id_key, for the id the entry is written with
    std::string ranks;
    std::string wanted;  // the id this replica serves it under, "" for a local one
    bool operator==(const Change&) const = default;
  };
  std::deque<Change> pending_;
  // Loop state, touched on ex_ only.
  std::string seen_version_;
  bool woken_ = false;
  bool reload_ = false;                         // reload the document whatever its version says
  boost::asio::steady_timer* sleep_ = nullptr;  // the loop's timer while it waits

  // Learning, touched on ex_ only. validating_: instances queued or being
  // validated, with whether the document still wants them (a removal seen
  // meanwhile cancels the add) and when their validation started (0 while
  // queued).
  static constexpr std::size_t kMaxValidating = 100'000;
  struct Validating {
    bool wanted = true;
    std::int64_t started_ms = 0;
  };
  std::optional<UpstreamValidator> validator_;
  std::unordered_map<std::string, Validating> validating_;
  std::deque<Learnt> to_validate_;
  std::vector<Learnt> passed_;
  std::size_t validators_running_ = 0;
  bool add_posted_ = false;
  std::optional<boost::asio::steady_timer> add_timer_;
  std::int64_t last_refusal_log_ms_ = 0;
  std::uint64_t refusals_not_logged_ = 0;
  std::int64_t last_document_log_ms_ = 0;
};

}  // namespace pdgate
