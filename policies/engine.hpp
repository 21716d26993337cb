// The policy engine: which script runs for each stage, reloading them, and
// the per-worker InstancePicker that runs them. See docs/policies.md.
//
// Threading: one PolicyEngine per gateway, shared by all workers; each
// worker's LuaPicker owns its own Lua state, so picks take no lock. A
// reload builds and checks the new scripts once, then bumps a generation
// counter; each worker notices it before its next pick and swaps states
// between picks. A request whose prefill was picked by the old version is
// picked (decode) and reported (on_complete) by the old version too.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "core/base/result.hpp"
#include "core/config/config.hpp"
#include "core/observability/prometheus.hpp"
#include "core/routing/kv_location_index.hpp"
#include "core/upstream/instance.hpp"
#include "policies/lua_vm.hpp"
#include "policies/lua_watchdog.hpp"
#include "policies/shared_state.hpp"

namespace pdgate::policy {

struct PolicySettings {
  // Per stage (indexed by Stage): a shipped policy's name or a .lua path.
  std::array<std::string, 3> specs{"round_robin", "round_robin", "round_robin"};
  std::string dir;  // names are looked up here first; empty: shipped ones only
  std::chrono::microseconds budget{1000};
  std::size_t memory_limit = 64u << 20;
  std::size_t prefix_block_bytes = 256;
  // --policy-log-level: a policy's (by name) own level for pdgate.log.
  std::vector<std::pair<std::string, std::string>> log_levels;
};

PolicySettings settings_from(const Config& cfg);

// The shipped policies, compiled into the binary (generated from
// policies/*.lua), so a clean checkout runs without an install step.
struct ShippedPolicy {
  const char* name;
  const char* text;
};
const std::vector<ShippedPolicy>& shipped_policies();

// A script's version: 12 hex digits of a hash of its text, the same on
// every replica that runs the same file.
std::string policy_version(std::string_view text);

// Resolves a spec to its text: a path (contains '/' or ends in .lua), a
// file NAME.lua in `dir`, or a shipped policy's name.
Result<PolicySource> resolve_policy(const std::string& spec, const std::string& dir);

// Counters for /metrics and tests. Fallbacks are requests routed by
// round-robin because the policy failed.
struct PolicyStats {
  std::atomic<std::uint64_t> picks{0};
  std::atomic<std::uint64_t> declined{0};
  std::atomic<std::uint64_t> rejected{0};  // picks that refused with a status
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> invalid{0};
  std::atomic<std::uint64_t> budget_exceeded{0};
  std::atomic<std::uint64_t> on_complete_errors{0};
  std::atomic<std::uint64_t> reloads{0};
  std::atomic<std::uint64_t> reload_failures{0};
  std::uint64_t fallbacks() const { return errors + invalid + budget_exceeded; }
};

class PolicyEngine : public std::enable_shared_from_this<PolicyEngine> {
 public:
  // Loads and self-checks the configured scripts; fails if any is broken
  // (at start-up a broken policy is a configuration error). `kv_index`:
  // where routes are recorded and looked up (the composition root passes
  // a shared one); null: an in-process policy::LocalKvIndex.
  static Result<std::shared_ptr<PolicyEngine>> create(
      PolicySettings settings, std::shared_ptr<KvLocationIndex> kv_index = nullptr);

  // Re-reads the configured scripts (SIGHUP, admin API). On failure the
  // running version stays and the error says which script and why.
  Result<bool> reload();
  // Switches to other scripts (e.g. the config file's policy keys changed).
  Result<bool> reload(PolicySettings settings);
  // Reloads if a script file's modification time or size changed since it
  // was loaded. Returns the reload's result, or nothing if none changed.
  std::optional<Result<bool>> reload_if_changed();
  // The same, saying what asked for it ("file", "signal", "admin") in
  // /admin/config's last error.
  Result<bool> reload(PolicySettings settings, const char* trigger);

  std::shared_ptr<const PolicyBundle> bundle() const;
  std::uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  PolicySettings settings() const;

  // A picker for one worker thread.
  std::unique_ptr<InstancePicker> make_picker(std::size_t worker_index);
  // A picker for POST /admin/policy/explain (core/pipeline/policy_explain.hpp):
  // a fresh state of the running version, its stages' instance tables
  // built from `set` as a worker's picks leave them, in which whatever
  // would change shared state (the store, pdgate.rate, rotation counters,
  // the KV-location index, counters, the log) answers as it would and
  // changes nothing; it explains each call (last_explanation()). Counts
  // nothing in PolicyStats or the policies' metrics.
  Result<std::unique_ptr<InstancePicker>> make_dry_picker(const InstanceSet& set);
  PickerFactory factory();

  PolicyStats& stats() { return stats_; }
  // Calls by policy, stage and outcome; pdgate.count's counters.
  PolicyMetrics& policy_metrics() { return policy_metrics_; }
  KvStore& kv() { return kv_; }
  // GET /admin/policy/kv: the first `limit` live keys of the shared store
  // that start with `prefix`, with their values and TTLs, as JSON text.
  std::string kv_listing(const std::string& prefix, std::size_t limit) const;
  // GET /admin/config's "policies": the running version, each stage's
  // policy (name, origin, content hash, file time) and the last rejected
  // reload's error, whatever triggered it (file change, SIGHUP, admin).
  std::string status_json() const;
  // pdgate_policy_reload_failures_total{policy}.
  void write_reload_metrics(PrometheusText& m) const;
  KvLocationIndex& kv_index() { return *kv_index_; }
  VmServices services() const;
  // What pdgate.cached_tokens() reads (docs/kv-events.md). Set before the
  // first picker is made.
  void set_exact_kv(std::shared_ptr<const KvBlockIndex> index,
                    std::shared_ptr<const Tokenizer> tokenizer);
  std::shared_ptr<RoundRobinPicker::Shared> round_robin_state() const { return rr_; }

  // Logs at most one line per second per kind, with a count of the lines
  // it held back, so a broken policy cannot flood the log.
  void log_limited(const std::string& kind, const std::string& message);

 private:
  PolicyEngine(PolicySettings settings, std::shared_ptr<KvLocationIndex> kv_index);
  // On failure `failed` names the policy at fault (its metric label).
  Result<std::shared_ptr<const PolicyBundle>> build(const PolicySettings& s,
                                                    std::string* failed = nullptr);

  struct FileStamp {
    std::filesystem::path path;
    std::filesystem::file_time_type mtime{};
    std::uintmax_t size = 0;
  };
  static std::vector<FileStamp> stamps_of(const PolicyBundle& b);

  mutable std::mutex mu_;  // guards settings_, bundle_, stamps_; serializes reloads
  PolicySettings settings_;
  std::shared_ptr<const PolicyBundle> bundle_;
  std::vector<FileStamp> stamps_;
  std::atomic<std::uint64_t> generation_{0};
  // The last rejected reload (under mu_), for /admin/config.
  struct ReloadError {
    std::string error;
    std::string policy;
    std::string trigger;
    std::int64_t wall_ms = 0;
  };
  ReloadError last_reload_error_;
  std::map<std::string, std::uint64_t> reload_failures_by_policy_;  // bounded by specs ever named

  PolicyStats stats_;
  PolicyMetrics policy_metrics_;
  KvStore kv_;
  std::shared_ptr<KvLocationIndex> kv_index_;
  std::shared_ptr<const KvBlockIndex> block_index_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  // Stops policy calls that slow instructions keep from the count hook.
  PolicyWatchdog watchdog_;
  VmServices services_;
  std::shared_ptr<RoundRobinPicker::Shared> rr_ = std::make_shared<RoundRobinPicker::Shared>();

  std::mutex log_mu_;
  struct LogState {
    std::chrono::steady_clock::time_point last{};
    std::uint64_t held = 0;
  };
  std::unordered_map<std::string, LogState> log_state_;
};

// Polls the script files' modification times every `poll_interval` on
// `ioc` and reloads the engine when one changed. Returns at once. (SIGHUP
// is the control loop's: core/control_loop.hpp.)
void start_policy_file_watch(boost::asio::io_context& ioc, std::shared_ptr<PolicyEngine> engine,
                             std::chrono::milliseconds poll_interval);

}  // namespace pdgate::policy
