#include "core/instance.hpp"

namespace pdgate {

const char* to_string(Stage s) {
  switch (s) {
    case Stage::encode: return "encode";
    case Stage::prefill: return "prefill";
    case Stage::decode: return "decode";
  }
  return "?";
}

const std::vector<InstancePtr>& InstanceSet::for_stage(Stage s) const {
  switch (s) {
    case Stage::encode: return encode;
    case Stage::prefill: return prefill;
    case Stage::decode: break;
  }
  return decode;
}

Registry::Registry(const Config& cfg) {
  auto set = std::make_shared<InstanceSet>();
  std::uint64_t next_id = 1;
  for (const auto& s : cfg.prefill) set->prefill.push_back(std::make_shared<Instance>(next_id++, s));
  for (const auto& s : cfg.decode) set->decode.push_back(std::make_shared<Instance>(next_id++, s));
  for (const auto& s : cfg.encode) set->encode.push_back(std::make_shared<Instance>(next_id++, s));
  set_ = std::move(set);
}

std::shared_ptr<const InstanceSet> Registry::snapshot() const {
  std::lock_guard lock(mu_);
  return set_;
}

InstancePtr RoundRobinPicker::pick(const std::vector<InstancePtr>& candidates,
                                   const PickContext& ctx) {
  const std::size_t n = candidates.size();
  if (n == 0) return nullptr;
  auto& counter = shared_->next[static_cast<int>(ctx.stage)];
  const std::uint64_t start = counter.fetch_add(1, std::memory_order_relaxed);
  // Skip unhealthy instances but keep the rotation fair among the rest.
  for (std::size_t i = 0; i < n; ++i) {
    const auto& c = candidates[(start + i) % n];
    if (c->healthy.load(std::memory_order_relaxed)) return c;
  }
  return nullptr;
}

PickerFactory RoundRobinPicker::factory() {
  auto shared = std::make_shared<Shared>();
  return [shared](std::size_t) { return std::make_unique<RoundRobinPicker>(shared); };
}

}  // namespace pdgate
