// The engine instances the gateway routes to, and the one seam where a
// stage's instance is chosen (InstancePicker). Instances are shared by all
// worker threads: their identity is immutable, their counters are atomics.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "core/config/config.hpp"
#include "core/net/errors.hpp"
#include "core/observability/metrics.hpp"
#include "core/upstream/instance_ids.hpp"
#include "core/upstream/load_signal.hpp"
#include "core/upstream/pick_lock.hpp"
#include "core/upstream/replica_order.hpp"

namespace pdgate {

enum class Stage { encode, prefill, decode };
const char* to_string(Stage s);

// One health observation, kept in a short per-instance history.
struct HealthEvent {
  std::int64_t at_ms = 0;  // system clock
  bool ok = false;
  std::string what;  // "check", "request", "ejected", "readmitted", ...
};

enum class InstanceState { active, draining, ejected };
const char* to_string(InstanceState s);

std::int64_t steady_now_ms();

struct Instance {
  using Labels = std::map<std::string, std::string>;

  Instance(std::uint64_t id_, UpstreamSpec spec_, Labels labels = {}, unsigned weight = 1)
      : id(id_),
        spec(std::move(spec_)),
        host_port(spec.host + ":" + std::to_string(spec.port)),
        location(instance_location(spec)),
        labels_(std::make_shared<const Labels>(std::move(labels))),
        weight_(weight) {
    if (spec.dp_rank)
      std::to_chars(dp_rank_header, dp_rank_header + sizeof dp_rank_header - 1, *spec.dp_rank);
  }

  const std::uint64_t id;
  const UpstreamSpec spec;
  // "host:port", as upstream requests' Host header carries it.
  const std::string host_port;
  // The URL, with "#dp<rank>" after it for a data-parallel rank: what
  // tells instances apart in the KV-location index, the load reports and
  // the KV-event feeds (instance_key(location)).
  const std::string location;
  // The rank as the X-data-parallel-rank header carries it ("" for an
  // engine without data parallelism), rendered once.
  char dp_rank_header[12] = {};

  // Labels and weight may change while the instance serves (PATCH
  // /admin/instances/{id}): readers take a snapshot, and a reader that
  // caches them (the policy engine's instance tables) compares
  // meta_version() to know when to look again.
  std::shared_ptr<const Labels> labels() const { return labels_.load(std::memory_order_acquire); }
  unsigned weight() const { return weight_.load(std::memory_order_relaxed); }
  std::uint64_t meta_version() const { return meta_version_.load(std::memory_order_acquire); }
  // Replaces what is given; returns whether anything changed.
  bool set_meta(const std::optional<Labels>& labels, std::optional<unsigned> weight) const;

 private:
  mutable std::atomic<std::shared_ptr<const Labels>> labels_;
  mutable std::atomic<unsigned> weight_;
  mutable std::atomic<std::uint64_t> meta_version_{0};

 public:
  // Requests this gateway (all workers) has in flight on the instance.
  mutable std::atomic<std::int64_t> in_flight{0};
  // Prompt tokens this gateway's requests wait to have computed there:
  // each leg that computes a prompt (a prefill, or a decode sent in one
  // hop) counts its uncached tokens from being sent to its first token.
  mutable std::atomic<std::int64_t> queued_tokens{0};
  // The same two figures summed over the other gateway replicas, from
  // their load reports (core/upstream/cluster_load.hpp); 0 when replicas
  // share nothing. Written by the load-sync thread only.
  mutable std::atomic<std::int64_t> others_in_flight{0};
  mutable std::atomic<std::int64_t> others_queued_tokens{0};
  // Milliseconds one queued prompt token costs on this engine, learnt from
  // completed prefills (core/upstream/load_model.hpp); 0 until learnt.
  mutable std::atomic<double> prefill_ms_per_token{0.0};
  // What it is learnt from: decayed sums of completed prefills' times and
  // of the tokens they waited for, under their own lock (taken once per
  // completed prefill, never by a pick, which reads the atomic above).
  mutable std::mutex prefill_cost_mu;
  mutable double prefill_cost_ms = 0;      // guarded by prefill_cost_mu
  mutable double prefill_cost_tokens = 0;  // guarded by prefill_cost_mu

  std::int64_t cluster_in_flight() const {
    return in_flight.load(std::memory_order_relaxed) +
           others_in_flight.load(std::memory_order_relaxed);
  }
  std::int64_t cluster_queued_tokens() const {
    return queued_tokens.load(std::memory_order_relaxed) +
           others_queued_tokens.load(std::memory_order_relaxed);
  }
  mutable std::atomic<std::uint64_t> requests_total{0};
  mutable std::atomic<std::uint64_t> failures_total{0};
  mutable std::atomic<bool> healthy{true};
  // Latency and token counts measured here, exported per instance.
  mutable InstanceLatency latency;

  // Engine-side load, scraped from the instance's /metrics (see
  // policies/metrics.hpp), summed over its engine cores. metrics_at_ms is
  // the steady-clock time of the last successful scrape, 0 before one.
  mutable std::atomic<std::int64_t> engine_running{0};
  mutable std::atomic<std::int64_t> engine_waiting{0};
  mutable std::atomic<double> kv_cache_usage{0.0};
  mutable std::atomic<std::int64_t> metrics_at_ms{0};
  // running + waiting minus the requests every gateway replica reported
  // in flight there at the time of the scrape (never below 0): the load
  // that reaches the engine around pdgate (clients calling it directly,
  // another router, replicas that share nothing). Added to the live
  // cluster-wide count, it completes the load without letting a scrape
  // up to an interval old hide or inflate what the replicas know.
  mutable std::atomic<std::int64_t> engine_other_load{0};

  // Given on the command line or in the config file (at start or by a
  // reload), not learnt at run time: the shared registry may not drain or
  // remove it (another replica's state for it is advice this replica's
  // operator did not give). Set before the instance is published.
  bool from_config = false;

  // Draining: no new requests (the registry keeps it out of the candidate
  // lists), in-flight ones finish. Cleared only by an undrain (and never
  // once the instance is marked for removal).
  std::atomic<bool> draining{false};
  std::atomic<bool> remove_when_idle{false};

  // Passive health (requests) and active health (checks). `healthy` false
  // means ejected; re-admission needs the back-off to have passed and, with
  // checks on, `rise` passed checks.
  mutable std::atomic<unsigned> consecutive_failures{0};
  mutable std::atomic<unsigned> check_passes{0};
  mutable std::atomic<unsigned> check_failures{0};
  mutable std::atomic<unsigned> ejections{0};
  mutable std::atomic<std::int64_t> ejected_until_ms{0};  // steady clock
  // When it was last (re-)admitted, steady clock: an instance that then
  // served this long without being ejected starts its back-off over.
  mutable std::atomic<std::int64_t> healthy_since_ms{steady_now_ms()};
  static constexpr std::int64_t kBackoffForgivenAfterMs = 30'000;

  InstanceState state() const {
    if (draining.load(std::memory_order_relaxed))
      return InstanceState::draining;
    return healthy.load(std::memory_order_relaxed) ? InstanceState::active : InstanceState::ejected;
  }

  // A request to the instance failed in a way that is the engine's fault
  // (connect error, timeout, 5xx: never a 4xx). Ejects it after
  // `eject_after` in a row. Returns true when this call ejected it.
  bool note_request_failure(unsigned eject_after, const std::string& why) const;
  void note_request_success() const { consecutive_failures.store(0, std::memory_order_relaxed); }
  // Active check result; fall/rise as configured. Returns true when this
  // call ejected it.
  bool note_check(bool ok, unsigned rise, unsigned fall, const std::string& why) const;
  // Ejected long enough with no active checks: back in.
  void readmit_if_due(bool checks_on) const;

  void record(bool ok, std::string what) const;
  std::vector<HealthEvent> history() const;

 private:
  // Returns false when it was already ejected.
  bool eject(const std::string& why) const;
  static constexpr std::size_t kHistory = 20;
  mutable std::mutex history_mu_;
  mutable std::deque<HealthEvent> history_;
};

using InstancePtr = std::shared_ptr<Instance>;

// Counts a request against an instance for exactly as long as it lives,
// and the prompt tokens it waits to have computed there until
// prompt_done() (or its end). Each change rings `signal` (when given), so
// that the replica's load report goes out at once.
class InFlightGuard {
 public:
  InFlightGuard() = default;
  explicit InFlightGuard(InstancePtr inst, std::int64_t queued_tokens = 0,
                         const LoadChangeSignal* signal = nullptr)
      : inst_(std::move(inst)), queued_(std::max<std::int64_t>(queued_tokens, 0)), signal_(signal) {
    inst_->in_flight.fetch_add(1, std::memory_order_relaxed);
    inst_->requests_total.fetch_add(1, std::memory_order_relaxed);
    if (queued_ != 0)
      inst_->queued_tokens.fetch_add(queued_, std::memory_order_relaxed);
    ring();
  }
  InFlightGuard(InFlightGuard&& o) noexcept
      : inst_(std::move(o.inst_)),
        queued_(std::exchange(o.queued_, 0)),
        signal_(std::exchange(o.signal_, nullptr)) {}
  InFlightGuard& operator=(InFlightGuard&& o) noexcept {
    release();
    inst_ = std::move(o.inst_);
    queued_ = std::exchange(o.queued_, 0);
    signal_ = std::exchange(o.signal_, nullptr);
    return *this;
  }
  InFlightGuard(const InFlightGuard&) = delete;
  InFlightGuard& operator=(const InFlightGuard&) = delete;
  ~InFlightGuard() { release(); }

  // The engine has computed the prompt (its first token came): the
  // request stays in flight, its tokens no longer queue.
  void prompt_done() {
    if (inst_ && queued_ != 0) {
      inst_->queued_tokens.fetch_sub(queued_, std::memory_order_relaxed);
      ring();
    }
    queued_ = 0;
  }

 private:
  void release() {
    prompt_done();
    if (inst_) {
      inst_->in_flight.fetch_sub(1, std::memory_order_relaxed);
      ring();
    }
    inst_.reset();
  }
  void ring() const noexcept {
    if (signal_ != nullptr)
      signal_->notify();
  }
  InstancePtr inst_;
  std::int64_t queued_ = 0;
  const LoadChangeSignal* signal_ = nullptr;
};

// An immutable view of the instance set; a new one replaces it whole when
// instances change, so readers never lock while they iterate. Only the
// Registry builds one, keeping these invariants: an instance of role
// "both" is in prefill and decode, every other one in its role's list,
// and a draining one only in `draining`; `by_id` lists each once, by
// ascending id, which keeps all() linear and find() logarithmic with
// thousands of instances.
struct InstanceSet {
  std::vector<InstancePtr> prefill;
  std::vector<InstancePtr> decode;
  std::vector<InstancePtr> encode;
  // Draining instances: still listed (and counted) but never candidates.
  std::vector<InstancePtr> draining;
  std::vector<InstancePtr> by_id;
  // Instances whose host is a name, not an address literal: the only ones
  // an address literal can be a second spelling of (by_id order).
  std::vector<InstancePtr> named;

  const std::vector<InstancePtr>& for_stage(Stage s) const;
  // Every instance once, by id.
  std::vector<InstancePtr> all() const { return by_id; }
  // nullptr when no instance has that id (it may have been forgotten since
  // the caller learnt the id): callers must check.
  InstancePtr find(std::uint64_t id) const;
};

// Whether an instance of role `a` and one of role `b` at the same URL would
// serve the same stage.
inline bool roles_overlap(Role a, Role b) {
  return a == b || a == Role::both || b == Role::both;
}

// Why a registry change was refused: its kind (not_found, conflict,
// forbidden, unprocessable) decides the status, in the one table
// (core/net/errors.hpp).
using RegistryError = GatewayError;

// What a registry change did: the instance it acted on, or why it refused.
// `instance` is set exactly when `error` is empty.
struct RegistryOutcome {
  std::optional<RegistryError> error;
  InstancePtr instance;
};

// An instance to add: what the admin API or another replica asked for.
struct NewInstance {
  UpstreamSpec spec;
  std::map<std::string, std::string> labels;
  unsigned weight = 1;
  bool from_config = false;  // see Instance::from_config
  // Its cluster-wide id (rank 0's; the ranks' follow), 0 for the registry
  // to number it (core/upstream/instance_ids.hpp).
  std::uint64_t id = 0;
};

// Where cluster-wide ids come from (plugins/shared_registry.cpp, through
// Redis): the registry only holds it, its users ask it before they add.
class InstanceIds {
 public:
  virtual ~InstanceIds() = default;
  // Rank 0's id for each engine, in order, on the caller's executor,
  // within a bounded time; 0 for an engine whose id could not be had
  // (Redis away or slow, an answer out of bounds): the registry numbers
  // that one.
  virtual boost::asio::awaitable<std::vector<std::uint64_t>> ids(
      std::vector<IdRequest> engines) = 0;
};

class Registry {
 public:
  // The instances of `cfg`; an engine found in `ids` (asked of the
  // cluster before the registry is made) takes that id.
  explicit Registry(const Config& cfg, const ClusterIds& ids = {});

  std::shared_ptr<const InstanceSet> snapshot() const;

  // Adds an instance (role both: prefill and decode); an engine with
  // data-parallel ranks (spec.dp_size > 1) as one instance per rank, the
  // outcome naming rank 0's. A conflict when an instance
  // with the same URL in an overlapping role exists (draining ones
  // included). `notify` false: a change learnt from another replica, not
  // announced.
  RegistryOutcome add(UpstreamSpec spec, std::map<std::string, std::string> labels = {},
                      unsigned weight = 1, bool notify = true);
  // Adds several at once, publishing one new set: one outcome per entry,
  // in order (a duplicate within the batch is refused like any other). An
  // entry with an id another instance already has is a conflict.
  std::vector<RegistryOutcome> add(std::vector<NewInstance> batch, bool notify = true);
  // Where cluster-wide ids come from; null (the default): this replica
  // numbers its instances. Set by the shared registry when it starts.
  void set_id_source(std::shared_ptr<InstanceIds> source) {
    id_source_.store(std::move(source), std::memory_order_release);
  }
  // Fills in the cluster's id of every entry of `batch` that has none,
  // when there is a source (else leaves them to be numbered here).
  boost::asio::awaitable<void> take_cluster_ids(std::vector<NewInstance>& batch) const;
  // The instance registered with exactly this role and URL (rank 0 of a
  // data-parallel engine), else nullptr.
  InstancePtr find(Role role, const std::string& url) const;
  // The instance an add of (role, url) would collide with, else nullptr.
  InstancePtr conflict(Role role, const std::string& url) const;
  // drain, undrain and update act on the whole engine: every rank of a
  // data-parallel one (an engine is one process to upgrade or relabel),
  // notified once.
  //
  // Takes an instance out of the candidate lists; its in-flight requests
  // finish. `then_remove`: forget it once idle (see forget_idle()), which
  // may be at once. The outcome holds the instance acted on, forgotten or
  // not, so the caller never has to look it up again; not_found when no
  // instance has the id.
  RegistryOutcome drain(std::uint64_t id, bool then_remove, bool notify = true);
  // Puts a draining instance back among the candidates. A conflict when it is
  // being removed; an active instance is left as it is.
  RegistryOutcome undrain(std::uint64_t id, bool notify = true);
  // Changes an instance's labels and/or weight (what is given replaces
  // what it had); notified as its current state when something changed.
  RegistryOutcome update(std::uint64_t id, const std::optional<Instance::Labels>& labels,
                         std::optional<unsigned> weight, bool notify = true);
  // Forgets draining instances marked for removal that have nothing in
  // flight. Returns how many were forgotten.
  std::size_t forget_idle();
  // Called after every local change with the instance and its new state
  // ("added" when it was just added, then "active", "draining",
  // "removed"; labels and weight changes are notified with the state it is
  // in), to share it; set before serving.
  std::function<void(const Instance&, const std::string&)> on_change;
  // Called, on whichever thread ejected it, when an instance is ejected
  // (failed checks or requests), so that requests still waiting on it
  // with nothing sent to their client fail over at once; set before
  // serving.
  std::function<void(const Instance&)> on_ejected;

  // Instances another replica shared (through Redis) that this one
  // refused because they failed validation (--allowed-upstreams,
  // --model); every refusal counts, retries included. For the admin API's
  // instance list and the pdgate_shared_instances_refused_total metric.
  void note_shared_refusal() { shared_refused_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t shared_refused_total() const {
    return shared_refused_.load(std::memory_order_relaxed);
  }
  // The shared document itself could not be read or used whole (too
  // large, unreadable in time, not JSON, too many entries): counted, and
  // the last reason kept, for /admin/instances and
  // pdgate_shared_registry_document_errors_total.
  void note_shared_document_error(std::string why);
  std::uint64_t shared_document_errors_total() const {
    return shared_document_errors_.load(std::memory_order_relaxed);
  }
  std::string last_shared_document_error() const;

  // Rung by every request that changes an instance's load (InFlightGuard),
  // heard by the thread that shares it with the other replicas.
  const LoadChangeSignal& load_signal() const { return load_signal_; }
  // Taken by every worker around a prefill pick and the reservation that
  // follows it (core/upstream/pick_lock.hpp).
  const PickLock& pick_lock() const { return pick_lock_; }
  // Where this replica stands among those sharing load, kept by the
  // thread that shares it: how long a recheck waits here.
  const ReplicaOrder& replica_order() const { return replica_order_; }

 private:
  InstancePtr conflict_locked(Role role, const std::string& url) const;
  // `inst` and the other ranks of its engine (same URL and role).
  std::vector<InstancePtr> engine_locked(const InstancePtr& inst) const;
  // The set a change under mu_ is made to: the published set itself when
  // no reader holds it, else a copy published in its place (the one it
  // replaces is moved to `replaced`, to be released after the lock).
  InstanceSet& writable_locked(std::shared_ptr<const InstanceSet>& replaced);

  mutable std::mutex mu_;
  // Published to readers as const; changed in place only by
  // writable_locked().
  std::shared_ptr<InstanceSet> set_;
  // URL -> the instances registered with it (at most one per role), under
  // mu_: duplicate checks and lookups by URL without scanning the set.
  std::unordered_map<std::string, std::vector<InstancePtr>> by_url_;
  // `ranks` consecutive ids no instance has, from next_id_ on (under mu_).
  std::uint64_t local_ids_locked(std::uint32_t ranks);
  // Whether an instance has one of `ranks` ids from `first` on (under mu_).
  bool ids_taken_locked(std::uint64_t first, std::uint32_t ranks) const;

  std::uint64_t next_id_ = 1;
  std::atomic<std::shared_ptr<InstanceIds>> id_source_;
  std::atomic<std::uint64_t> shared_refused_{0};
  std::atomic<std::uint64_t> shared_document_errors_{0};
  mutable std::mutex document_error_mu_;
  std::string last_document_error_;
  LoadChangeSignal load_signal_;
  PickLock pick_lock_;
  ReplicaOrder replica_order_;
};

struct ClientKey;  // core/pipeline/client_keys.hpp

// What an attempt at a stage met, for the pick that retries it elsewhere
// (docs/policies.md, "Retries"): the instance, and the failure's kind as
// policies see it ("connect", "timeout", "status_500", ...).
struct PickFailure {
  InstancePtr instance;
  std::string kind;
  unsigned status = 0;  // what the engine answered, 0 if it did not
};

// A request's failed attempts, per stage (indexed by Stage), kept by the
// pipeline where the pick context can point at it for the request's life.
struct PickRetries {
  std::array<unsigned, 3> failed_attempts{0, 0, 0};
  std::array<std::optional<PickFailure>, 3> last;
};

// What a picker may look at, gathered before it runs: pickers never do
// I/O. It grows as policies need more.
struct PickContext {
  Stage stage = Stage::decode;
  std::string_view model;
  bool stream = false;
  bool is_chat = false;
  // Raw JSON text of the prompt (`prompt`) or conversation (`messages`).
  std::string_view prompt_raw;
  // The prompt's token ids as an engine's POST /tokenize gave them
  // (--tokenizer vllm), read before routing; null when not asked for.
  const std::vector<std::uint32_t>* token_ids = nullptr;
  std::optional<std::string> conversation_id;
  std::string_view request_id;
  const Instance* chosen_prefill = nullptr;  // for decode
  // Request headers a policy may read (e.g. a session header), names in
  // lower case. Filled by the pipeline for the headers it chooses to pass.
  std::vector<std::pair<std::string_view, std::string_view>> headers;
  // The same headers produced on demand, for when few policies read them:
  // for_each_header(header_source, user, emit) calls emit(user, name,
  // value) for each header passed, the name lower-cased (valid only during
  // that call). Used when `headers` is empty, so a request whose policy
  // never reads ctx.headers pays nothing for them.
  using HeaderEmit = void (*)(void* user, std::string_view name, std::string_view value);
  void (*for_each_header)(const void* source, void* user, HeaderEmit emit) = nullptr;
  const void* header_source = nullptr;
  // The client's API key (--api-keys), null when keys are off: policies
  // route tenants by its name and labels.
  const ClientKey* key = nullptr;
  // Failover: the attempts at each stage that failed so far, and the last
  // one's failure (ctx.attempt, ctx.failed); null before any failed.
  const PickRetries* retries = nullptr;
  // How many times this request's stream was resumed on another decode
  // after its decode broke off mid-answer: 0 on a request's first legs, 1
  // on the first resumed leg's picks (ctx.migrations). A policy that
  // refuses when it is non-zero opts out of resuming: the client gets the
  // error event instead (docs/resumption.md).
  unsigned migrations = 0;
  // A number no other request of this worker has (0: none): what keys a
  // policy's state for this request (ctx.vars) from its hook to its picks.
  std::uint64_t serial = 0;
  // A policy's pdgate.RECHECK (docs/policies.md, "Waiting for the other
  // replicas' picks"): how long the caller would wait for the replicas
  // ahead of this one before asking again (ctx.recheck_ms; 0: it would ask
  // again at once, or cannot wait), and whether this is that second pick
  // (ctx.rechecked), which must answer.
  std::chrono::milliseconds recheck_wait{0};
  bool rechecked = false;
};

// How a routed request ended, for policies that learn.
struct PickOutcome {
  Stage stage = Stage::decode;
  bool ok = false;
  unsigned status = 0;  // HTTP status the engine answered, 0 if none
  // To the engine's response header: for a stream, nothing about the
  // engine's speed (vLLM answers the header before it schedules).
  std::chrono::microseconds time_to_header{0};
  // To the first token: a stream's first SSE data event; for a whole
  // answer (prefill, encode, a non-streaming decode), the whole answer.
  // 0 when none came.
  std::chrono::microseconds time_to_first_token{0};
  std::chrono::microseconds total{0};
};

// The request hook's view of a request and what it decided
// (core/routing/request_hook.hpp): only the pipeline and the policy engine need
// their definitions.
struct RequestHookInput;
struct RequestDecision;

// Why a policy's pick answered no instance, when the policy meant it to
// end the request: a refusal with a status of its own (`return nil, 429,
// "message", {headers}`), or a fail-closed policy that declined (nil) or
// failed (error, budget, a bad answer).
struct PickRefusal {
  // "declined", "rejected" (with a status), or the failure:
  // "error", "invalid", "budget".
  const char* reason = "declined";
  unsigned status = 0;  // 400..599 for "rejected"
  std::string message;  // the policy's (rejected) or the failure's (operators only)
  std::vector<std::pair<std::string, std::string>> headers;  // checked
};

// What a dry pick or request hook saw and answered (POST
// /admin/policy/explain, core/pipeline/policy_explain.hpp); filled only by
// a picker made to explain (PolicyEngine::make_dry_picker).
struct PickExplanation {
  std::string policy;   // the script's name, as in metrics
  std::string version;  // a hash of its text, as /admin/config shows it
  // picks: chosen, declined, rejected, error, invalid, budget;
  // the request hook: accepted, rejected, error, invalid, budget.
  std::string outcome;
  bool fallback = false;  // a failure or decline routed round-robin
  std::string error;
  // By candidate position: the prompt's leading prefix blocks recently
  // routed there (the approximate index), the prompt tokens its engine
  // holds by its KV events (-1: no exact data), and what the pick's own
  // lookups found there (what it queues as cached).
  std::vector<std::int64_t> prefix_blocks;
  std::vector<std::int64_t> exact_tokens;
  std::vector<std::int64_t> cached_tokens;
  std::int64_t prompt_blocks = 0;
  std::vector<std::string> log;  // pdgate.log lines of the call (not logged)
  // The pick answered pdgate.RECHECK and was asked again (ctx.rechecked):
  // what it chose is the second answer.
  bool rechecked = false;
};

// Chooses an instance for one stage of one request. Each worker thread has
// its own picker (created by a PickerFactory), so a picker needs no locks
// for its own state.
class InstancePicker {
 public:
  virtual ~InstancePicker() = default;
  // Returns nullptr when no candidate is usable.
  virtual InstancePtr pick(const std::vector<InstancePtr>& candidates, const PickContext& ctx) = 0;
  // Called once per pick when the stage's exchange has ended.
  virtual void on_complete(const Instance& /*chosen*/, const PickContext& /*ctx*/,
                           const PickOutcome& /*outcome*/) {}
  // The request hook (policy API v2), once per request before routing:
  // reject it, edit headers and a few body fields, choose its path.
  // Returns false when the policy has none (`out` untouched).
  virtual bool on_request(const RequestHookInput& /*in*/, RequestDecision& /*out*/) {
    return false;
  }
  // Whether the last pick's null answer came from a failed policy that is
  // fail-closed (503), not from a lack of usable instances.
  virtual bool failed_closed() const { return false; }
  // Why the last pick's null answer ends the request (the policy refused
  // it, or a fail-closed policy declined or failed); null when it does
  // not (no usable instance).
  virtual const PickRefusal* last_refusal() const { return nullptr; }
  // Whether the last pick's null answer asks the caller to wait
  // ctx.recheck_wait and pick again (the policy's pdgate.RECHECK; only when
  // that wait is not 0, else the picker asked again itself).
  virtual bool wants_recheck() const { return false; }
  // Prompt tokens the last pick's instance was believed to hold cached,
  // as the policy's lookups saw them (0 when it looked up nothing): the
  // rest is the work the request queues there (InFlightGuard).
  virtual std::int64_t last_pick_cached_tokens() const { return 0; }
  // The name (as in metrics) and version (a hash of its text) of the
  // policy running for `stage`, for the access log; empty: not known.
  virtual std::pair<std::string, std::string> policy_of(Stage /*stage*/) const { return {}; }
  // What the last pick or on_request saw and answered, for a picker that
  // explains; null for the others.
  virtual const PickExplanation* last_explanation() const { return nullptr; }
};

using PickerFactory = std::function<std::unique_ptr<InstancePicker>(std::size_t worker_index)>;

// Round-robin per stage over healthy instances (the default policy). The
// rotation is shared by all workers so the spread stays even.
class RoundRobinPicker final : public InstancePicker {
 public:
  struct Shared {
    std::atomic<std::uint64_t> next[3] = {0, 0, 0};
  };
  explicit RoundRobinPicker(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  InstancePtr pick(const std::vector<InstancePtr>& candidates, const PickContext& ctx) override;
  // What pick() would answer now, without moving the rotation.
  InstancePtr peek(const std::vector<InstancePtr>& candidates, const PickContext& ctx) const;

  static PickerFactory factory();

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace pdgate
