#include "core/instance.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace pdgate {

namespace {

std::int64_t system_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Re-admission back-off: 1s, 2s, 4s, ... capped at a minute, so an engine
// that keeps failing is tried less and less often.
std::int64_t backoff_ms(unsigned ejections) {
  const unsigned shift = std::min(ejections == 0 ? 0u : ejections - 1, 6u);
  return std::min<std::int64_t>(1000LL << shift, 60'000);
}

}  // namespace

std::int64_t steady_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* to_string(InstanceState s) {
  switch (s) {
    case InstanceState::active:
      return "active";
    case InstanceState::draining:
      return "draining";
    case InstanceState::ejected:
      return "ejected";
  }
  return "?";
}

void Instance::record(bool ok, std::string what) const {
  std::lock_guard lock(history_mu_);
  history_.push_back({system_now_ms(), ok, std::move(what)});
  while (history_.size() > kHistory)
    history_.pop_front();
}

std::vector<HealthEvent> Instance::history() const {
  std::lock_guard lock(history_mu_);
  return {history_.begin(), history_.end()};
}

bool Instance::eject(const std::string& why) const {
  auto& h = healthy;
  bool expected = true;
  if (!h.compare_exchange_strong(expected, false))
    return false;
  const unsigned n = ejections.fetch_add(1) + 1;
  ejected_until_ms.store(steady_now_ms() + backoff_ms(n));
  check_passes.store(0);
  spdlog::warn("instance {} ({}) ejected: {}", id, spec.url, why);
  record(false, "ejected: " + why);
  return true;
}

bool Instance::note_request_failure(unsigned eject_after, const std::string& why) const {
  const unsigned n = consecutive_failures.fetch_add(1, std::memory_order_relaxed) + 1;
  record(false, "request: " + why);
  if (n >= eject_after && healthy.load())
    return eject(std::to_string(n) + " consecutive failures, last: " + why);
  return false;
}

bool Instance::note_check(bool ok, unsigned rise, unsigned fall, const std::string& why) const {
  if (ok) {
    check_failures.store(0);
    const unsigned passes = check_passes.fetch_add(1) + 1;
    if (!healthy.load() && passes >= rise && steady_now_ms() >= ejected_until_ms.load()) {
      consecutive_failures.store(0);
      healthy.store(true);
      spdlog::info("instance {} ({}) re-admitted after {} passed check(s)", id, spec.url, passes);
      record(true, "readmitted");
    }
    return false;
  }
  check_passes.store(0);
  const unsigned fails = check_failures.fetch_add(1) + 1;
  record(false, "check: " + why);
  if (fails < fall || !healthy.load())
    return false;
  return eject("health check failed " + std::to_string(fails) + " time(s): " + why);
}

void Instance::readmit_if_due(bool checks_on) const {
  if (checks_on || healthy.load() || steady_now_ms() < ejected_until_ms.load())
    return;
  consecutive_failures.store(0);
  healthy.store(true);
  spdlog::info("instance {} ({}) re-admitted after its back-off", id, spec.url);
  record(true, "readmitted after back-off");
}

const char* to_string(Stage s) {
  switch (s) {
    case Stage::encode:
      return "encode";
    case Stage::prefill:
      return "prefill";
    case Stage::decode:
      return "decode";
  }
  return "?";
}

const std::vector<InstancePtr>& InstanceSet::for_stage(Stage s) const {
  switch (s) {
    case Stage::encode:
      return encode;
    case Stage::prefill:
      return prefill;
    case Stage::decode:
      break;
  }
  return decode;
}

std::vector<InstancePtr> InstanceSet::all() const {
  std::vector<InstancePtr> out;
  for (const auto* list : {&prefill, &decode, &encode, &draining}) {
    for (const auto& i : *list) {
      if (std::find(out.begin(), out.end(), i) == out.end())
        out.push_back(i);
    }
  }
  return out;
}

InstancePtr InstanceSet::find(std::uint64_t id) const {
  for (const auto* list : {&prefill, &decode, &encode, &draining}) {
    for (const auto& i : *list) {
      if (i->id == id)
        return i;
    }
  }
  return nullptr;
}

Registry::Registry(const Config& cfg) {
  auto set = std::make_shared<InstanceSet>();
  for (const auto& s : cfg.prefill)
    set->prefill.push_back(std::make_shared<Instance>(next_id_++, s));
  for (const auto& s : cfg.decode)
    set->decode.push_back(std::make_shared<Instance>(next_id_++, s));
  for (const auto& s : cfg.encode)
    set->encode.push_back(std::make_shared<Instance>(next_id_++, s));
  set_ = std::move(set);
}

std::shared_ptr<const InstanceSet> Registry::snapshot() const {
  std::lock_guard lock(mu_);
  return set_;
}

std::pair<std::optional<RegistryError>, InstancePtr> Registry::add(
    UpstreamSpec spec, std::map<std::string, std::string> labels, unsigned weight, bool notify) {
  InstancePtr inst;
  {
    std::lock_guard lock(mu_);
    for (const auto& i : set_->all()) {
      const bool overlap =
          i->spec.role == spec.role || i->spec.role == Role::both || spec.role == Role::both;
      if (overlap && i->spec.url == spec.url) {
        return {RegistryError{409, std::string(to_string(i->spec.role)) + " instance " + spec.url +
                                       " is already registered (id " + std::to_string(i->id) +
                                       ", " + to_string(i->state()) + ")"},
                nullptr};
      }
    }
    auto next = std::make_shared<InstanceSet>(*set_);
    inst = std::make_shared<Instance>(next_id_++, spec, std::move(labels), weight);
    switch (spec.role) {
      case Role::prefill:
        next->prefill.push_back(inst);
        break;
      case Role::decode:
        next->decode.push_back(inst);
        break;
      case Role::encode:
        next->encode.push_back(inst);
        break;
      case Role::both:
        next->prefill.push_back(inst);
        next->decode.push_back(inst);
        break;
    }
    set_ = std::move(next);
  }
  inst->record(true, "added");
  if (notify && on_change)
    on_change(*inst, "active");
  return {std::nullopt, inst};
}

RegistryOutcome Registry::drain(std::uint64_t id, bool then_remove, bool notify) {
  InstancePtr inst;
  {
    std::lock_guard lock(mu_);
    inst = set_->find(id);
    if (!inst)
      return {RegistryError{404, "no instance with id " + std::to_string(id)}, nullptr};
    if (then_remove)
      inst->remove_when_idle.store(true);
    if (!inst->draining.exchange(true)) {
      auto next = std::make_shared<InstanceSet>(*set_);
      for (auto* list : {&next->prefill, &next->decode, &next->encode})
        std::erase(*list, inst);
      next->draining.push_back(inst);
      set_ = std::move(next);
      inst->record(true, "draining");
    }
  }
  forget_idle();
  if (notify && on_change)
    on_change(*inst, then_remove ? "removed" : "draining");
  return {std::nullopt, std::move(inst)};
}

std::size_t Registry::forget_idle() {
  std::lock_guard lock(mu_);
  auto next = std::make_shared<InstanceSet>(*set_);
  const auto before = next->draining.size();
  std::erase_if(next->draining, [](const InstancePtr& i) {
    return i->remove_when_idle.load() && i->in_flight.load() == 0;
  });
  const auto n = before - next->draining.size();
  if (n > 0)
    set_ = std::move(next);
  return n;
}

InstancePtr RoundRobinPicker::pick(const std::vector<InstancePtr>& candidates,
                                   const PickContext& ctx) {
  const std::size_t n = candidates.size();
  if (n == 0)
    return nullptr;
  auto& counter = shared_->next[static_cast<int>(ctx.stage)];
  const std::uint64_t start = counter.fetch_add(1, std::memory_order_relaxed);
  // Skip unhealthy instances but keep the rotation fair among the rest.
  for (std::size_t i = 0; i < n; ++i) {
    const auto& c = candidates[(start + i) % n];
    if (c->healthy.load(std::memory_order_relaxed))
      return c;
  }
  return nullptr;
}

PickerFactory RoundRobinPicker::factory() {
  auto shared = std::make_shared<Shared>();
  return [shared](std::size_t) { return std::make_unique<RoundRobinPicker>(shared); };
}

}  // namespace pdgate
