// The engine instances the gateway routes to, and the one seam where a
// stage's instance is chosen (InstancePicker). Instances are shared by all
// worker threads: their identity is immutable, their counters are atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
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

// What a picker may look at. It grows as policies need more (the Lua
// policy engine fills the rest); pickers never do I/O.
struct PickContext {
  Stage stage = Stage::decode;
  std::string_view model;
  bool stream = false;
  bool is_chat = false;
  const Instance* chosen_prefill = nullptr;  // for decode
};

class InstancePicker {
 public:
  virtual ~InstancePicker() = default;
  // Returns nullptr when no candidate is usable.
  virtual InstancePtr pick(const std::vector<InstancePtr>& candidates, const PickContext& ctx) = 0;
};

// Round-robin per stage over healthy instances (the default policy).
class RoundRobinPicker final : public InstancePicker {
 public:
  InstancePtr pick(const std::vector<InstancePtr>& candidates, const PickContext& ctx) override;

 private:
  std::atomic<std::uint64_t> next_[3] = {0, 0, 0};
};

}  // namespace pdgate
