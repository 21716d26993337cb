// One LuaJIT state running one version of the configured policies (one
// script per stage). All Lua/C interaction lives in the VM's files
// (lua_vm.cpp, lua_sandbox.cpp, lua_pdgate_lib.cpp, lua_request_api.cpp,
// lua_context.cpp; their shared state in policies/detail/) and the
// sandbox's bounded library (lua_bounded_lib.cpp, lua_budget.hpp); nothing
// else in pdgate includes a Lua header.
//
// A LuaVm belongs to one worker thread. It is created from a PolicyBundle
// (the scripts' text), so a reload builds a new LuaVm and the worker swaps
// to it between picks.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/base/result.hpp"
#include "core/routing/kv_block_index.hpp"
#include "core/routing/kv_location_index.hpp"
#include "core/routing/request_hook.hpp"
#include "core/routing/tokenizer.hpp"
#include "core/upstream/instance.hpp"
#include "policies/policy_counters.hpp"
#include "policies/shared_state.hpp"

namespace spdlog {
class logger;
}

namespace pdgate::policy {

class PolicyWatchdog;

// One stage's script: what the user named, where it came from, its text.
struct PolicySource {
  std::string spec;    // as configured: "least_load" or "/etc/pdgate/mine.lua"
  std::string origin;  // "builtin:least_load" or the file path
  std::string text;
};

// The scripts of one version, indexed by Stage.
struct PolicyBundle {
  std::array<PolicySource, 3> stages;
  std::uint64_t generation = 0;
};

// What every VM of an engine shares: limits and the cross-worker state.
struct VmServices {
  std::chrono::microseconds budget{1000};
  std::size_t memory_limit = 64u << 20;
  std::size_t prefix_block_bytes = 256;
  KvStore* kv = nullptr;
  // Where prefixes and conversations were routed (this replica's view,
  // fed by the others' when shared).
  KvLocationIndex* kv_index = nullptr;
  // Exact KV blocks from the engines' events, and the tokenizer that turns
  // a prompt into ids to look up (pdgate.cached_tokens()); both optional.
  const KvBlockIndex* block_index = nullptr;
  const Tokenizer* tokenizer = nullptr;
  // Interrupts calls stuck in slow instructions; optional (lua_watchdog.hpp).
  PolicyWatchdog* watchdog = nullptr;
  // Per-policy counters (calls, pdgate.count, pdgate.log's limit); a VM
  // given none keeps its own.
  PolicyMetrics* metrics = nullptr;
  // What `require(name)` loads: a shipped policy's text, or null when
  // there is none of that name. Null: require knows no module.
  const char* (*module_text)(std::string_view name) = nullptr;
  // --policy-log-level: policies' own levels (spdlog's, by policy name),
  // and the logger their lines at such a level go to (the default
  // logger's sinks, every level let through: the policy's level decides).
  std::vector<std::pair<std::string, int>> log_levels;
  std::shared_ptr<spdlog::logger> logger;
  // A VM that explains (PolicyEngine::make_dry_picker): what would change
  // shared state answers as it would and changes nothing (lua_state.hpp).
  bool dry = false;
};

// A request's prefix block hashes, computed at most once however many
// stages and helpers ask (the worker keeps a few recent requests').
class PrefixHashCache {
 public:
  const std::vector<std::uint64_t>& get(const PickContext& ctx, std::size_t block_bytes);

 private:
  struct Entry {
    std::string request_id;
    const char* data = nullptr;
    std::size_t size = 0;
    std::vector<std::uint64_t> hashes;
  };
  static constexpr std::size_t kSlots = 8;
  std::array<Entry, kSlots> slots_;
  std::size_t next_ = 0;
};

// rejected: the script answered `nil, status, message [, headers]`;
// recheck: it answered pdgate.RECHECK (ask again once the other replicas'
// picks are in).
enum class PickStatus { chosen, declined, rejected, recheck, error, invalid, budget };
const char* to_string(PickStatus s);

struct PickAnswer {
  PickStatus status = PickStatus::declined;
  std::size_t index = 0;  // into the candidates, when chosen
  std::string error;      // why, when error / invalid / budget
  // Prompt tokens the chosen instance holds, as this pick's lookups
  // (pdgate.prefix_matches, pdgate.cached_tokens) found; 0 when none ran.
  std::int64_t cached_tokens = 0;
  // When rejected: the status, message and checked headers; `error` then
  // lists headers that were dropped (out of bounds), if any.
  PickRefusal refusal;
};

// How a request hook call went.
enum class HookStatus { accepted, rejected, error, invalid, budget };
const char* to_string(HookStatus s);

struct HookAnswer {
  HookStatus status = HookStatus::accepted;
  // Why, when error / invalid / budget; when rejected, the refusal's
  // headers that were dropped (out of bounds), if any.
  std::string error;
};

class LuaVm {
 public:
  // Loads every stage's script into a fresh sandboxed state. Fails with a
  // message naming the script when one does not compile, does not return a
  // table with a `pick` function, or errors while loading.
  static Result<std::unique_ptr<LuaVm>> create(const PolicyBundle& bundle,
                                               const VmServices& services);
  ~LuaVm();
  LuaVm(const LuaVm&) = delete;
  LuaVm& operator=(const LuaVm&) = delete;

  std::uint64_t generation() const { return generation_; }

  PickAnswer pick(const std::vector<InstancePtr>& candidates, const PickContext& ctx,
                  PrefixHashCache& hashes);
  // Returns an error message if the hook failed (the caller counts it).
  std::optional<std::string> on_complete(const Instance& chosen, const PickContext& ctx,
                                         const PickOutcome& outcome, PrefixHashCache& hashes);
  bool has_on_complete(Stage s) const;

  // The decode script's on_request (docs/policies.md), if it has one.
  // Fills `out` as the script decided; on a failure `out` may hold part of
  // the decision (the caller discards it).
  // `hashes`: the worker's cache, so the picks that follow reuse the
  // prompt's hashes if the hook computed them.
  HookAnswer on_request(const RequestHookInput& in, RequestDecision& out, PrefixHashCache& hashes);
  bool has_on_request() const;
  // The request's ctx.vars table is no longer needed (its decode ended).
  void drop_vars(std::uint64_t serial);
  // The stage's script declared `fail_closed = true`: a failure answers
  // 503 instead of falling back to round-robin.
  bool fail_closed(Stage s) const;
  // The counters of the script running at `where` (a Stage, or
  // kRequestHook: the decode script's).
  PolicyCounters& counters(int where);

  // Picks on a synthetic request and instance set for each stage: the
  // answer must be an instance or a decline, within the budget.
  Result<bool> self_check();

  // Bytes the state holds (for tests and the memory cap).
  std::size_t memory_used() const;

  // For a dry VM (VmServices::dry), what POST /admin/policy/explain shows:
  // the stages' instance tables built as a worker's last picks left them
  // (pdgate.prefix_held, pdgate.conversation read them), the pdgate.log
  // lines of the last call, and, after a pick, what each candidate holds
  // of the prompt and what the pick's lookups found there.
  void prime(Stage stage, const std::vector<InstancePtr>& candidates);
  std::vector<std::string> take_log();
  void explain_candidates(const std::vector<InstancePtr>& candidates, const PickContext& ctx,
                          PrefixHashCache& hashes, PickExplanation& out);

  struct Impl;

 private:
  explicit LuaVm(std::unique_ptr<Impl> impl, std::uint64_t generation);
  std::unique_ptr<Impl> impl_;
  std::uint64_t generation_;
};

}  // namespace pdgate::policy
