#include "core/upstream/instance.hpp"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>
#include <boost/asio/this_coro.hpp>

namespace pdgate {

namespace net = boost::asio;

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

bool Instance::set_meta(const std::optional<Labels>& labels, std::optional<unsigned> weight) const {
  bool changed = false;
  if (labels && *labels != *labels_.load()) {
    labels_.store(std::make_shared<const Labels>(*labels), std::memory_order_release);
    changed = true;
  }
  if (weight && *weight != weight_.load()) {
    weight_.store(*weight, std::memory_order_relaxed);
    changed = true;
  }
  if (changed)
    meta_version_.fetch_add(1, std::memory_order_acq_rel);
  return changed;
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
  // The back-off grows with each ejection, but only while ejections come
  // close together: an engine restarted now and then (a deploy, a crash a
  // day) would otherwise reach the one-minute cap for good, and when its
  // peers failed there would be nothing to route to for a minute although
  // it was healthy.
  const std::int64_t now = steady_now_ms();
  if (now - healthy_since_ms.load() >= kBackoffForgivenAfterMs)
    ejections.store(0);
  const unsigned n = ejections.fetch_add(1) + 1;
  ejected_until_ms.store(now + backoff_ms(n));
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
      healthy_since_ms.store(steady_now_ms());
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
  healthy_since_ms.store(steady_now_ms());
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

InstancePtr InstanceSet::find(std::uint64_t id) const {
  const auto it = std::lower_bound(by_id.begin(), by_id.end(), id,
                                   [](const InstancePtr& i, std::uint64_t v) { return i->id < v; });
  return it != by_id.end() && (*it)->id == id ? *it : nullptr;
}

namespace {

// Role lists, like by_id, are in id order (an undrained instance goes back
// to its place), so policies see a stable order.
void insert_by_id(std::vector<InstancePtr>& list, const InstancePtr& inst) {
  const auto at =
      std::lower_bound(list.begin(), list.end(), inst->id,
                       [](const InstancePtr& i, std::uint64_t id) { return i->id < id; });
  list.insert(at, inst);
}

bool host_is_name(const std::string& host) {
  return host.find(':') == std::string::npos && !std::all_of(host.begin(), host.end(), [](char c) {
           return (c >= '0' && c <= '9') || c == '.';
         });
}

// `with_id`: also into by_id (a new instance; an undrained one is there).
void add_to_lists(InstanceSet& set, const InstancePtr& inst, bool with_id = true) {
  switch (inst->spec.role) {
    case Role::prefill:
      insert_by_id(set.prefill, inst);
      break;
    case Role::decode:
      insert_by_id(set.decode, inst);
      break;
    case Role::encode:
      insert_by_id(set.encode, inst);
      break;
    case Role::both:
      insert_by_id(set.prefill, inst);
      insert_by_id(set.decode, inst);
      break;
  }
  if (with_id) {
    // Not always last: a cluster id may be lower than ids listed before.
    insert_by_id(set.by_id, inst);
    if (host_is_name(inst->spec.host))
      insert_by_id(set.named, inst);
  }
}

}  // namespace

std::string cluster_id_key(Role role, const std::string& url, std::uint32_t dp_size) {
  std::string key = std::string(to_string(role)) + "|" + url;
  if (dp_size > 1)
    key += "|dp=" + std::to_string(dp_size);
  return key;
}

Registry::Registry(const Config& cfg, const ClusterIds& ids) {
  set_ = std::make_shared<InstanceSet>();
  // With a shared registry, an engine whose cluster id could not be had
  // is numbered where no cluster id reaches.
  if (!cfg.redis_url.empty())
    next_id_ = kLocalIdBase;
  auto add = [&](const UpstreamSpec& engine, std::vector<InstancePtr>& list) {
    const auto specs = instance_specs(engine);
    const auto ranks = static_cast<std::uint32_t>(specs.size());
    std::uint64_t id = 0;
    if (const auto it = ids.find(cluster_id_key(engine.role, engine.url, engine.dp_size));
        it != ids.end()) {
      if (it->second != 0 && it->second < kLocalIdBase && !ids_taken_locked(it->second, ranks))
        id = it->second;
      else
        spdlog::error("{} {}: the cluster's id {} is taken here; numbered locally",
                      to_string(engine.role), engine.url, it->second);
    }
    if (id == 0)
      id = local_ids_locked(ranks);
    // A data-parallel engine: one instance per rank, consecutive ids.
    for (const UpstreamSpec& s : specs) {
      auto inst = std::make_shared<Instance>(id++, s, s.labels, s.weight);
      inst->from_config = true;
      insert_by_id(list, inst);
      insert_by_id(set_->by_id, inst);
      if (host_is_name(s.host))
        insert_by_id(set_->named, inst);
      by_url_[s.url].push_back(std::move(inst));
    }
  };
  for (const auto& s : cfg.prefill)
    add(s, set_->prefill);
  for (const auto& s : cfg.decode)
    add(s, set_->decode);
  for (const auto& s : cfg.encode)
    add(s, set_->encode);
}

net::awaitable<void> Registry::take_cluster_ids(std::vector<NewInstance>& batch) const {
  const auto source = id_source_.load(std::memory_order_acquire);
  if (!source)
    co_return;
  std::vector<IdRequest> asked;
  std::vector<std::size_t> at;
  for (std::size_t k = 0; k < batch.size(); ++k) {
    if (batch[k].id != 0)
      continue;
    asked.push_back({batch[k].spec.role, batch[k].spec.url, batch[k].spec.dp_size});
    at.push_back(k);
  }
  if (asked.empty())
    co_return;
  const auto ids = co_await source->ids(std::move(asked));
  for (std::size_t k = 0; k < at.size() && k < ids.size(); ++k)
    batch[at[k]].id = ids[k];
}

bool Registry::ids_taken_locked(std::uint64_t first, std::uint32_t ranks) const {
  const auto& by_id = set_->by_id;
  const auto it = std::lower_bound(by_id.begin(), by_id.end(), first,
                                   [](const InstancePtr& i, std::uint64_t v) { return i->id < v; });
  return it != by_id.end() && (*it)->id - first < ranks;
}

std::uint64_t Registry::local_ids_locked(std::uint32_t ranks) {
  // Ids handed out here only grow; skipping those the cluster gave keeps
  // every id naming one instance.
  while (ids_taken_locked(next_id_, ranks))
    ++next_id_;
  const std::uint64_t first = next_id_;
  next_id_ += ranks;
  return first;
}

std::shared_ptr<const InstanceSet> Registry::snapshot() const {
  std::lock_guard lock(mu_);
  return set_;
}

InstanceSet& Registry::writable_locked(std::shared_ptr<const InstanceSet>& replaced) {
  // A reader takes the set only through snapshot(), under mu_, which the
  // caller holds: when the registry's is the only reference, nobody can
  // be reading the set or take it before the change is done, and the set
  // is changed in place. So a run of adds with no request in flight (an
  // instance list registered at start, or a bulk add through the admin
  // API) costs each add its own work, not a copy of every instance list;
  // with readers, an add still copies the lists it changes with the rest.
  if (set_.use_count() == 1) {
    // The readers' last releases of the set (acquire-release decrements)
    // happen before the writes below.
    std::atomic_thread_fence(std::memory_order_acquire);
    return *set_;
  }
  auto next = std::make_shared<InstanceSet>(*set_);
  replaced = std::exchange(set_, std::move(next));
  return *set_;
}

InstancePtr Registry::conflict_locked(Role role, const std::string& url) const {
  const auto it = by_url_.find(url);
  if (it == by_url_.end())
    return nullptr;
  for (const auto& i : it->second) {
    if (roles_overlap(i->spec.role, role))
      return i;
  }
  return nullptr;
}

InstancePtr Registry::conflict(Role role, const std::string& url) const {
  std::lock_guard lock(mu_);
  return conflict_locked(role, url);
}

InstancePtr Registry::find(Role role, const std::string& url) const {
  std::lock_guard lock(mu_);
  const auto it = by_url_.find(url);
  if (it == by_url_.end())
    return nullptr;
  for (const auto& i : it->second) {
    if (i->spec.role == role)
      return i;
  }
  return nullptr;
}

RegistryOutcome Registry::add(UpstreamSpec spec, std::map<std::string, std::string> labels,
                              unsigned weight, bool notify) {
  std::vector<NewInstance> one;
  one.push_back({std::move(spec), std::move(labels), weight});
  return std::move(add(std::move(one), notify).front());
}

std::vector<RegistryOutcome> Registry::add(std::vector<NewInstance> batch, bool notify) {
  std::vector<RegistryOutcome> out(batch.size());
  // The replaced set is released after the lock: freeing thousands of
  // pointers must not hold up workers taking a snapshot.
  std::shared_ptr<const InstanceSet> replaced;
  {
    std::lock_guard lock(mu_);
    InstanceSet* next = nullptr;
    for (std::size_t k = 0; k < batch.size(); ++k) {
      auto& b = batch[k];
      // Every source checks labels before it gets here (with its own
      // error); this holds the bound for any caller that did not.
      if (auto why = label_problem(b.labels)) {
        out[k].error = client_error(ErrorKind::unprocessable, "labels: " + *why);
        continue;
      }
      if (auto i = conflict_locked(b.spec.role, b.spec.url)) {
        out[k].error = client_error(
            ErrorKind::conflict, std::string(to_string(i->spec.role)) + " instance " + b.spec.url +
                                     " is already registered (id " + std::to_string(i->id) + ", " +
                                     to_string(i->state()) + ")");
        continue;
      }
      auto specs = instance_specs(b.spec);
      const auto ranks = static_cast<std::uint32_t>(specs.size());
      if (b.id != 0 && (b.id >= kLocalIdBase || ids_taken_locked(b.id, ranks))) {
        out[k].error = client_error(ErrorKind::conflict, std::string(to_string(b.spec.role)) +
                                                             " instance " + b.spec.url + ": id " +
                                                             std::to_string(b.id) + " is not free");
        continue;
      }
      // At most one copy of the set for the whole batch.
      if (!next)
        next = &writable_locked(replaced);
      // A data-parallel engine: one instance per rank, consecutive ids.
      std::uint64_t id = b.id != 0 ? b.id : local_ids_locked(ranks);
      for (UpstreamSpec& s : specs) {
        auto inst = std::make_shared<Instance>(id++, std::move(s), b.labels, b.weight);
        inst->from_config = b.from_config;
        add_to_lists(*next, inst);
        by_url_[inst->spec.url].push_back(inst);
        if (!out[k].instance)
          out[k].instance = std::move(inst);  // rank 0 stands for the engine
      }
    }
  }
  for (const auto& o : out) {
    if (!o.instance)
      continue;
    o.instance->record(true, "added");
    if (notify && on_change)
      on_change(*o.instance, "added");
  }
  return out;
}

namespace {

// A change named an id no instance has (any longer).
RegistryError no_such_instance(std::uint64_t id) {
  return client_error(ErrorKind::not_found, "no instance with id " + std::to_string(id));
}

}  // namespace

std::vector<InstancePtr> Registry::engine_locked(const InstancePtr& inst) const {
  if (inst->spec.dp_size <= 1)
    return {inst};
  std::vector<InstancePtr> out;
  if (auto it = by_url_.find(inst->spec.url); it != by_url_.end()) {
    for (const auto& i : it->second) {
      if (i->spec.role == inst->spec.role)
        out.push_back(i);
    }
  }
  if (out.empty())
    out.push_back(inst);
  return out;
}

RegistryOutcome Registry::drain(std::uint64_t id, bool then_remove, bool notify) {
  InstancePtr inst;
  std::shared_ptr<const InstanceSet> replaced;  // released after the lock
  {
    std::lock_guard lock(mu_);
    inst = set_->find(id);
    if (!inst)
      return {no_such_instance(id), nullptr};
    for (const InstancePtr& i : engine_locked(inst)) {
      if (then_remove)
        i->remove_when_idle.store(true);
      if (!i->draining.exchange(true)) {
        auto& next = writable_locked(replaced);
        for (auto* list : {&next.prefill, &next.decode, &next.encode})
          std::erase(*list, i);
        next.draining.push_back(i);
        i->record(true, "draining");
      }
    }
  }
  forget_idle();
  if (notify && on_change)
    on_change(*inst, then_remove ? "removed" : "draining");
  return {std::nullopt, std::move(inst)};
}

namespace {

// The state an instance is shared as.
const char* shared_state(const Instance& i) {
  if (i.remove_when_idle.load())
    return "removed";
  return i.draining.load() ? "draining" : "active";
}

}  // namespace

RegistryOutcome Registry::undrain(std::uint64_t id, bool notify) {
  InstancePtr inst;
  std::shared_ptr<const InstanceSet> replaced;  // released after the lock
  {
    std::lock_guard lock(mu_);
    inst = set_->find(id);
    if (!inst)
      return {no_such_instance(id), nullptr};
    if (inst->remove_when_idle.load()) {
      return {client_error(ErrorKind::conflict, "instance " + std::to_string(id) +
                                                    " is being removed; add it again instead"),
              nullptr};
    }
    if (!inst->draining.load())
      return {std::nullopt, std::move(inst)};
    for (const InstancePtr& i : engine_locked(inst)) {
      if (!i->draining.load() || i->remove_when_idle.load())
        continue;
      auto& next = writable_locked(replaced);
      std::erase(next.draining, i);
      i->draining.store(false);
      add_to_lists(next, i, /*with_id=*/false);
      i->record(true, "undrained");
    }
  }
  if (notify && on_change)
    on_change(*inst, "active");
  return {std::nullopt, std::move(inst)};
}

RegistryOutcome Registry::update(std::uint64_t id, const std::optional<Instance::Labels>& labels,
                                 std::optional<unsigned> weight, bool notify) {
  InstancePtr inst = snapshot()->find(id);
  if (!inst)
    return {no_such_instance(id), nullptr};
  if (labels) {
    if (auto why = label_problem(*labels))
      return {client_error(ErrorKind::unprocessable, "labels: " + *why), nullptr};
  }
  std::vector<InstancePtr> engine;
  {
    std::lock_guard lock(mu_);
    engine = engine_locked(inst);
  }
  bool changed = false;
  for (const InstancePtr& i : engine) {
    if (i->set_meta(labels, weight)) {
      i->record(true, "labels/weight changed");
      changed = true;
    }
  }
  if (changed && notify && on_change)
    on_change(*inst, shared_state(*inst));
  return {std::nullopt, std::move(inst)};
}

void Registry::note_shared_document_error(std::string why) {
  shared_document_errors_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(document_error_mu_);
  last_document_error_ = std::move(why);
}

std::string Registry::last_shared_document_error() const {
  std::lock_guard lock(document_error_mu_);
  return last_document_error_;
}

std::size_t Registry::forget_idle() {
  auto idle = [](const InstancePtr& i) {
    return i->remove_when_idle.load() && i->in_flight.load() == 0;
  };
  std::shared_ptr<const InstanceSet> replaced;  // released after the lock
  std::lock_guard lock(mu_);
  // Called every few hundred milliseconds: the set is copied only when
  // something is to be forgotten.
  std::vector<InstancePtr> gone;
  for (const auto& i : set_->draining) {
    if (idle(i))
      gone.push_back(i);
  }
  if (gone.empty())
    return 0;
  auto by_id = [](const InstancePtr& a, const InstancePtr& b) { return a->id < b->id; };
  std::sort(gone.begin(), gone.end(), by_id);
  auto is_gone = [&](const InstancePtr& i) {
    return std::binary_search(gone.begin(), gone.end(), i, by_id);
  };
  auto& next = writable_locked(replaced);
  std::erase_if(next.draining, is_gone);
  std::erase_if(next.by_id, is_gone);
  std::erase_if(next.named, is_gone);
  for (const auto& i : gone) {
    auto it = by_url_.find(i->spec.url);
    if (it == by_url_.end())
      continue;
    std::erase(it->second, i);
    if (it->second.empty())
      by_url_.erase(it);
  }
  return gone.size();
}

namespace {

// The first healthy candidate from the rotation's `start`: unhealthy
// instances are skipped but the rotation stays fair among the rest.
InstancePtr first_healthy_from(const std::vector<InstancePtr>& candidates, std::uint64_t start) {
  const std::size_t n = candidates.size();
  for (std::size_t i = 0; i < n; ++i) {
    const auto& c = candidates[(start + i) % n];
    if (c->healthy.load(std::memory_order_relaxed))
      return c;
  }
  return nullptr;
}

}  // namespace

InstancePtr RoundRobinPicker::pick(const std::vector<InstancePtr>& candidates,
                                   const PickContext& ctx) {
  if (candidates.empty())
    return nullptr;
  auto& counter = shared_->next[static_cast<int>(ctx.stage)];
  return first_healthy_from(candidates, counter.fetch_add(1, std::memory_order_relaxed));
}

InstancePtr RoundRobinPicker::peek(const std::vector<InstancePtr>& candidates,
                                   const PickContext& ctx) const {
  if (candidates.empty())
    return nullptr;
  const auto& counter = shared_->next[static_cast<int>(ctx.stage)];
  return first_healthy_from(candidates, counter.load(std::memory_order_relaxed));
}

PickerFactory RoundRobinPicker::factory() {
  auto shared = std::make_shared<Shared>();
  return [shared](std::size_t) { return std::make_unique<RoundRobinPicker>(shared); };
}

}  // namespace pdgate
