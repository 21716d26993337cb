// The engine instances the gateway routes to, and the one seam where a
// stage's instance is chosen (InstancePicker). Instances are shared by all
// worker threads: their identity is immutable, their counters are atomics.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/config.hpp"

namespace pdgate {

enum class Stage { encode, prefill, decode };
const char* to_string(Stage s);

struct Instance {
  Instance(std::uint64_t id_, UpstreamSpec spec_) : id(id_), spec(std::move(spec_)) {}

  const std::uint64_t id;
  const UpstreamSpec spec;

  // Requests this gateway (all workers) has in flight on the instance.
  mutable std::atomic<std::int64_t> in_flight{0};
  mutable std::atomic<std::uint64_t> requests_total{0};
  mutable std::atomic<std::uint64_t> failures_total{0};
  std::atomic<bool> healthy{true};

  // Engine-side load, scraped from the instance's /metrics (see
  // policies/metrics.hpp), summed over its engine cores. metrics_at_ms is
  // the steady-clock time of the last successful scrape, 0 before one.
  mutable std::atomic<std::int64_t> engine_running{0};
  mutable std::atomic<std::int64_t> engine_waiting{0};
  mutable std::atomic<double> kv_cache_usage{0.0};
  mutable std::atomic<std::int64_t> metrics_at_ms{0};
  // running + waiting minus this gateway's own in-flight requests at the
  // time of the scrape: the load other gateways (or clients) put on the
  // engine. Added to the exact, live in_flight, it estimates the load
  // without letting a scrape up to an interval old hide or inflate ours.
  mutable std::atomic<std::int64_t> engine_other_load{0};
};

using InstancePtr = std::shared_ptr<Instance>;

// Counts a request against an instance for exactly as long as it lives.
class InFlightGuard {
 public:
  InFlightGuard() = default;
  explicit InFlightGuard(InstancePtr inst) : inst_(std::move(inst)) {
    inst_->in_flight.fetch_add(1, std::memory_order_relaxed);
    inst_->requests_total.fetch_add(1, std::memory_order_relaxed);
  }
  InFlightGuard(InFlightGuard&& o) noexcept : inst_(std::move(o.inst_)) {}
  InFlightGuard& operator=(InFlightGuard&& o) noexcept {
    release();
    inst_ = std::move(o.inst_);
    return *this;
  }
  InFlightGuard(const InFlightGuard&) = delete;
  InFlightGuard& operator=(const InFlightGuard&) = delete;
  ~InFlightGuard() { release(); }

 private:
  void release() {
    if (inst_) inst_->in_flight.fetch_sub(1, std::memory_order_relaxed);
    inst_.reset();
  }
  InstancePtr inst_;
};

// An immutable view of the instance set; a new one replaces it whole when
// instances change, so readers never lock while they iterate.
struct InstanceSet {
  std::vector<InstancePtr> prefill;
  std::vector<InstancePtr> decode;
  std::vector<InstancePtr> encode;

  const std::vector<InstancePtr>& for_stage(Stage s) const;
};

class Registry {
 public:
  explicit Registry(const Config& cfg);

  std::shared_ptr<const InstanceSet> snapshot() const;

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const InstanceSet> set_;
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
  std::optional<std::string> conversation_id;
  std::string_view request_id;
  const Instance* chosen_prefill = nullptr;  // for decode
  // Request headers a policy may read (e.g. a session header), names in
  // lower case. Filled by the pipeline for the headers it chooses to pass.
  std::vector<std::pair<std::string_view, std::string_view>> headers;
};

// How a routed request ended, for policies that learn.
struct PickOutcome {
  Stage stage = Stage::decode;
  bool ok = false;
  unsigned status = 0;  // HTTP status the engine answered, 0 if none
  std::chrono::microseconds time_to_first_byte{0};
  std::chrono::microseconds total{0};
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

  static PickerFactory factory();

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace pdgate
