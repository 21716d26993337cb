// SIGHUP: re-reads the command line and its config file and applies
// everything that can change while serving (see README, "Reloading"):
// instance lists, timeouts, limits, policies, the log level. Keys that
// need a restart are named in the log and keep their running values. A
// new configuration that is invalid in any way (a bad value, an instance
// listed twice under two names, a policy that does not load) is refused
// whole and the running one stays.
//
// Runs on the control thread; a SIGHUP that arrives while a reload is
// under way (its names resolving) is applied after it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "core/base/result.hpp"
#include "core/config/config.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

// What a reload did to the instance lists, one line per change.
struct InstanceChanges {
  std::vector<std::string> lines;
};

// Brings the registry from `before`'s instance lists to `after`'s: an
// instance only `after` lists is added, one only `before` listed is
// drained and then forgotten once idle, one both list keeps its id (its
// labels and weight follow `after`). Instances added at run time (admin
// API, another replica) are not the config's to remove and stay.
// An instance to add takes its id from `ids` (cluster_ids_for), else the
// registry numbers it.
InstanceChanges reconcile_instances(Registry& registry, const Config& before, const Config& after,
                                    const ClusterIds& ids = {});
// The cluster's ids (core/upstream/instance_ids.hpp) of the
// engines `after` lists that the registry does not, by cluster_id_key:
// asked before they are added, so that an id is never renumbered. Empty
// without a shared registry.
boost::asio::awaitable<ClusterIds> cluster_ids_for(const Registry& registry, const Config& after);

class ConfigReloader {
 public:
  struct Hooks {
    // Reads the configuration again (the command line and its file).
    std::function<Result<Config>()> read;
    // Switches the policies to the new configuration's; a failure refuses
    // the reload.
    std::function<Result<bool>(const Config&)> reload_policies;
    // Loads the listener's TLS certificate and key again; a failure
    // refuses the reload. The action it returns (empty: nothing to do)
    // installs them once the rest of the reload is accepted.
    std::function<Result<std::function<void()>>()> prepare_tls;
    // Reads the --api-keys file again, as prepare_tls: a file that does
    // not parse refuses the reload; the action installs the keys.
    std::function<Result<std::function<void()>>()> prepare_keys;
    // The cluster's ids of the engines an accepted configuration adds
    // (cluster_ids_for); unset: the registry numbers them.
    std::function<boost::asio::awaitable<ClusterIds>(const Config& next)> cluster_ids;
    // Hands an accepted configuration to the gateway's threads, with the
    // keys the file changed that wait for a restart and the ids of the
    // engines it adds.
    std::function<void(const Config& before, std::shared_ptr<const Config> next,
                       std::vector<std::string> restart_needed, const ClusterIds& ids)>
        apply;
    // Told why a reload was refused (every error, a line each).
    std::function<void(const std::string& why)> refused;
  };

  ConfigReloader(boost::asio::any_io_executor control, Config running, Hooks hooks);

  // Starts a reload (SIGHUP). Returns at once.
  void reload();
  // The configuration in force (control thread only).
  const Config& running() const { return *running_; }
  // Reloads applied and refused so far (control thread only).
  std::uint64_t applied() const { return applied_; }
  std::uint64_t refused() const { return refused_; }

 private:
  boost::asio::awaitable<void> run();
  boost::asio::awaitable<Result<bool>> once();

  boost::asio::any_io_executor control_;
  std::shared_ptr<const Config> running_;
  Hooks hooks_;
  bool busy_ = false;
  bool again_ = false;
  std::uint64_t applied_ = 0;
  std::uint64_t refused_ = 0;
};

}  // namespace pdgate
