#include "policies/engine.hpp"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <sstream>
#include <system_error>

#include <spdlog/spdlog.h>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "core/base/clock.hpp"
#include "policies/local_kv_index.hpp"
#include "policies/prefix_hash.hpp"

namespace pdgate::policy {
namespace {

namespace net = boost::asio;
namespace fs = std::filesystem;

Result<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return fail("cannot read policy file '" + path.string() + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in && !in.eof())
    return fail("cannot read policy file '" + path.string() + "'");
  return ss.str();
}

std::vector<std::pair<std::string, int>> log_levels_of(const PolicySettings& s) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [name, level] : s.log_levels)
    out.emplace_back(name, static_cast<int>(spdlog::level::from_str(level)));
  return out;
}

bool is_path(const std::string& spec) {
  return spec.find('/') != std::string::npos ||
         (spec.size() > 4 && spec.compare(spec.size() - 4, 4, ".lua") == 0);
}

}  // namespace

PolicySettings settings_from(const Config& cfg) {
  PolicySettings s;
  const auto or_default = [&](const std::string& v) { return v.empty() ? cfg.policy : v; };
  s.specs[static_cast<int>(Stage::encode)] = or_default(cfg.policy_encode);
  s.specs[static_cast<int>(Stage::prefill)] = or_default(cfg.policy_prefill);
  s.specs[static_cast<int>(Stage::decode)] = or_default(cfg.policy_decode);
  s.dir = cfg.policy_dir;
  s.budget = cfg.policy_budget;
  s.memory_limit = cfg.policy_memory;
  s.prefix_block_bytes = cfg.prefix_block_size;
  s.log_levels = cfg.policy_log_levels;
  return s;
}

Result<PolicySource> resolve_policy(const std::string& spec, const std::string& dir) {
  PolicySource src;
  src.spec = spec;
  if (spec.empty())
    return fail("empty policy name");
  if (is_path(spec)) {
    std::error_code ec;
    const fs::path abs = fs::absolute(spec, ec);
    src.origin = ec ? spec : abs.lexically_normal().string();
    auto text = read_text(src.origin);
    if (!text)
      return fail(text.error());
    src.text = std::move(*text);
    return src;
  }
  if (!dir.empty()) {
    const fs::path p = fs::path(dir) / (spec + ".lua");
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) {
      src.origin = fs::absolute(p, ec).lexically_normal().string();
      auto text = read_text(src.origin);
      if (!text)
        return fail(text.error());
      src.text = std::move(*text);
      return src;
    }
  }
  std::string names;
  for (const auto& sp : shipped_policies()) {
    if (spec == sp.name) {
      src.origin = std::string("builtin:") + sp.name;
      src.text = sp.text;
      return src;
    }
    names += names.empty() ? "" : ", ";
    names += sp.name;
  }
  return fail("unknown policy '" + spec + "' (shipped: " + names +
              (dir.empty() ? "" : "; nor " + dir + "/" + spec + ".lua") +
              "; a path must contain '/' or end in .lua)");
}

std::string PolicyEngine::kv_listing(const std::string& prefix, std::size_t limit) const {
  std::size_t matched = 0;
  const auto rows = kv_.list(prefix, limit, steady_now_ms(), matched);
  auto keys = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json v;
    if (const auto* d = std::get_if<double>(&r.value))
      v = *d;
    else if (const auto* str = std::get_if<std::string>(&r.value))
      v = *str;
    else
      v = std::get<bool>(r.value);
    keys.push_back({{"key", r.key},
                    {"value", v},
                    {"ttl_seconds",
                     r.ttl_ms == 0 ? nlohmann::json(nullptr) : nlohmann::json(r.ttl_ms / 1000.0)}});
  }
  nlohmann::json j = {{"keys", keys},
                      {"matched", matched},
                      {"truncated", matched > rows.size()},
                      {"bytes", kv_.bytes()}};
  // Keys are the policies' own strings: invalid UTF-8 is replaced.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string policy_version(std::string_view text) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash64(text)));
  return std::string(buf, 12);
}

// --- The per-worker picker ----------------------------------------------------

namespace {

// The second look of a pick that answered pdgate.RECHECK (ctx.rechecked).
PickAnswer pick_again(LuaVm& vm, const std::vector<InstancePtr>& candidates, const PickContext& ctx,
                      PrefixHashCache& hashes) {
  PickContext again = ctx;
  again.rechecked = true;
  return vm.pick(candidates, again, hashes);
}

class LuaPicker final : public InstancePicker {
 public:
  LuaPicker(std::shared_ptr<PolicyEngine> engine, std::size_t worker)
      : engine_(std::move(engine)), worker_(worker), fallback_(engine_->round_robin_state()) {
    refresh();
  }

  InstancePtr pick(const std::vector<InstancePtr>& candidates, const PickContext& ctx) override {
    failed_closed_ = false;
    refusal_.reset();
    recheck_ = false;
    last_cached_ = 0;
    if (candidates.empty())
      return nullptr;
    refresh();
    const std::shared_ptr<LuaVm>& vm = vm_for(ctx);
    if (!vm)
      return fallback_.pick(candidates, ctx);
    auto& stats = engine_->stats();
    stats.picks.fetch_add(1, std::memory_order_relaxed);
    PickAnswer a = vm->pick(candidates, ctx, hashes_);
    PolicyCounters& counters = vm->counters(static_cast<int>(ctx.stage));
    if (a.status == PickStatus::recheck) {
      counters.call(static_cast<int>(ctx.stage), CallOutcome::recheck);
      if (ctx.recheck_wait.count() > 0) {
        recheck_ = true;  // the caller waits for the replicas ahead, then asks again
        return nullptr;
      }
      // Nothing to wait for (or the caller cannot wait): asked again at once.
      a = pick_again(*vm, candidates, ctx, hashes_);
    }
    switch (a.status) {
      case PickStatus::chosen:
        counters.call(static_cast<int>(ctx.stage), CallOutcome::picked);
        if (ctx.stage == Stage::prefill)
          pin(ctx, vm);
        last_cached_ = a.cached_tokens;
        return candidates[a.index];
      case PickStatus::declined:
        stats.declined.fetch_add(1, std::memory_order_relaxed);
        counters.call(static_cast<int>(ctx.stage), CallOutcome::declined);
        break;
      case PickStatus::rejected:
        // A refusal with a status ends the request whether or not the
        // policy is fail-closed: it is the policy's answer, not a failure.
        stats.rejected.fetch_add(1, std::memory_order_relaxed);
        counters.call(static_cast<int>(ctx.stage), CallOutcome::rejected);
        if (!a.error.empty()) {
          engine_->log_limited("refusal headers", std::string("policy ") + to_string(ctx.stage) +
                                                      " refusal: headers dropped: " + a.error);
        }
        refusal_ = a.refusal;
        failed_closed_ = true;
        return nullptr;
      case PickStatus::recheck:  // only a first answer: a second one is invalid
      case PickStatus::error:
        stats.errors.fetch_add(1, std::memory_order_relaxed);
        counters.call(static_cast<int>(ctx.stage), CallOutcome::error);
        break;
      case PickStatus::invalid:
        stats.invalid.fetch_add(1, std::memory_order_relaxed);
        counters.call(static_cast<int>(ctx.stage), CallOutcome::error);
        break;
      case PickStatus::budget:
        stats.budget_exceeded.fetch_add(1, std::memory_order_relaxed);
        counters.call(static_cast<int>(ctx.stage), CallOutcome::budget);
        break;
    }
    // A fail-closed policy's failure or decline ends the request (503):
    // its rule (e.g. which tenants may use which instances) must not be
    // bypassed by round-robin over all instances.
    const bool closed = vm->fail_closed(ctx.stage);
    if (a.status != PickStatus::declined) {
      engine_->log_limited(to_string(a.status), std::string("policy ") + to_string(ctx.stage) +
                                                    " pick failed (" + to_string(a.status) + "), " +
                                                    (closed ? "request refused (fail-closed): "
                                                            : "request routed round-robin: ") +
                                                    a.error);
    }
    if (closed) {
      failed_closed_ = true;
      refusal_.emplace();
      refusal_->reason = to_string(a.status);
      refusal_->message = a.error;
      return nullptr;
    }
    auto chosen = fallback_.pick(candidates, ctx);
    if (chosen && ctx.stage == Stage::prefill)
      pin(ctx, vm);
    return chosen;
  }

  bool failed_closed() const override { return failed_closed_; }
  const PickRefusal* last_refusal() const override { return refusal_ ? &*refusal_ : nullptr; }
  bool wants_recheck() const override { return recheck_; }
  std::int64_t last_pick_cached_tokens() const override { return last_cached_; }
  std::pair<std::string, std::string> policy_of(Stage stage) const override {
    return names_[static_cast<std::size_t>(stage)];
  }

  bool on_request(const RequestHookInput& in, RequestDecision& out) override {
    refresh();
    if (!current_ || !current_->has_on_request())
      return false;
    const HookAnswer a = current_->on_request(in, out, hashes_);
    PolicyCounters& counters = current_->counters(kRequestHook);
    switch (a.status) {
      case HookStatus::accepted:
        counters.call(kRequestHook, CallOutcome::accepted);
        return true;
      case HookStatus::rejected:
        counters.call(kRequestHook, CallOutcome::rejected);
        if (!a.error.empty()) {
          engine_->log_limited("refusal headers",
                               "policy on_request refusal: headers dropped: " + a.error);
        }
        return true;
      case HookStatus::error:
      case HookStatus::invalid:
        engine_->stats().errors.fetch_add(1, std::memory_order_relaxed);
        counters.call(kRequestHook, CallOutcome::error);
        break;
      case HookStatus::budget:
        engine_->stats().budget_exceeded.fetch_add(1, std::memory_order_relaxed);
        counters.call(kRequestHook, CallOutcome::budget);
        break;
    }
    // A failed hook decided nothing: what it did before failing is undone.
    out = RequestDecision{};
    const bool closed = current_->fail_closed(Stage::decode);
    engine_->log_limited(
        std::string("on_request ") + to_string(a.status),
        std::string("policy on_request failed (") + to_string(a.status) + "), " +
            (closed ? "request refused (fail-closed): " : "request routed as configured: ") +
            a.error);
    out.failed_closed = closed;
    out.error = a.error;
    return true;
  }

  void on_complete(const Instance& chosen, const PickContext& ctx,
                   const PickOutcome& outcome) override {
    if (ctx.stage == Stage::decode && outcome.ok && ctx.conversation_id) {
      ConversationRoute e;
      e.decode = instance_key(chosen.location);
      e.prefill = ctx.chosen_prefill != nullptr ? instance_key(ctx.chosen_prefill->location) : 0;
      e.at_ms = steady_now_ms();
      engine_->kv_index().record_conversation(*ctx.conversation_id, e);
    }
    std::shared_ptr<LuaVm> vm = vm_for(ctx);
    // The request is over for this version once its decode is reported,
    // or its prefill failed (no decode will follow).
    if (ctx.stage == Stage::decode || (ctx.stage == Stage::prefill && !outcome.ok))
      unpin(ctx);
    // A failed decode may be retried, its pick reading ctx.vars again: its
    // table goes when the request succeeds, or with the oldest ones.
    if (vm && ctx.stage == Stage::decode && outcome.ok)
      vm->drop_vars(ctx.serial);
    if (!vm || !vm->has_on_complete(ctx.stage))
      return;
    if (auto err = vm->on_complete(chosen, ctx, outcome, hashes_)) {
      engine_->stats().on_complete_errors.fetch_add(1, std::memory_order_relaxed);
      engine_->log_limited("on_complete", std::string("policy ") + to_string(ctx.stage) +
                                              " on_complete failed: " + *err);
    }
  }

 private:
  // Swaps to the engine's current version between picks.
  void refresh() {
    const std::uint64_t gen = engine_->generation();
    if (gen == seen_generation_)
      return;
    seen_generation_ = gen;
    auto bundle = engine_->bundle();
    auto vm = LuaVm::create(*bundle, engine_->services());
    if (!vm) {
      // The engine checked these scripts already; this is e.g. memory.
      engine_->log_limited("worker-load", "worker " + std::to_string(worker_) +
                                              " cannot load policy version " + std::to_string(gen) +
                                              ": " + vm.error());
      return;
    }
    current_ = std::shared_ptr<LuaVm>(std::move(*vm));
    for (std::size_t i = 0; i < names_.size(); ++i)
      names_[i] = {policy_label(bundle->stages[i].spec), policy_version(bundle->stages[i].text)};
  }

  const std::shared_ptr<LuaVm>& vm_for(const PickContext& ctx) {
    if (ctx.stage != Stage::prefill && !pins_.empty() && !ctx.request_id.empty()) {
      auto it = pins_.find(std::string(ctx.request_id));
      if (it != pins_.end())
        return it->second;
    }
    return current_;
  }

  void pin(const PickContext& ctx, const std::shared_ptr<LuaVm>& vm) {
    if (ctx.request_id.empty())
      return;
    // Requests that vanished without a report (client gone mid-prefill)
    // would pin forever; the cap bounds that, at worst moving a few
    // in-flight requests to the newer version.
    if (pins_.size() >= kMaxPins)
      pins_.clear();
    pins_[std::string(ctx.request_id)] = vm;
  }
  void unpin(const PickContext& ctx) {
    if (!pins_.empty() && !ctx.request_id.empty())
      pins_.erase(std::string(ctx.request_id));
  }

  static constexpr std::size_t kMaxPins = 16384;
  std::shared_ptr<PolicyEngine> engine_;
  std::size_t worker_;
  RoundRobinPicker fallback_;
  std::uint64_t seen_generation_ = ~std::uint64_t{0};
  std::shared_ptr<LuaVm> current_;
  std::unordered_map<std::string, std::shared_ptr<LuaVm>> pins_;
  PrefixHashCache hashes_;
  bool recheck_ = false;
  bool failed_closed_ = false;
  // Why the last pick ended its request, when the policy refused it.
  std::optional<PickRefusal> refusal_;
  std::int64_t last_cached_ = 0;
  // Each stage's policy name and version, as current_ runs them.
  std::array<std::pair<std::string, std::string>, 3> names_;
};

// The explaining picker (make_dry_picker): one request's hook and picks
// in a dry VM of its own, each call's answer and what it saw kept for
// last_explanation(). A failed or declined pick is routed as the workers'
// pickers route it (round-robin, not moved; or refused when fail-closed).
class DryPicker final : public InstancePicker {
 public:
  DryPicker(std::shared_ptr<PolicyEngine> engine, std::shared_ptr<const PolicyBundle> bundle,
            std::unique_ptr<LuaVm> vm)
      : engine_(std::move(engine)),
        bundle_(std::move(bundle)),
        vm_(std::move(vm)),
        fallback_(engine_->round_robin_state()) {}

  InstancePtr pick(const std::vector<InstancePtr>& candidates, const PickContext& ctx) override {
    begin(static_cast<int>(ctx.stage));
    if (candidates.empty()) {
      explained_.outcome = "no candidates";
      return nullptr;
    }
    PickAnswer a = vm_->pick(candidates, ctx, hashes_);
    if (a.status == PickStatus::recheck) {
      // A live pick would wait for the replicas ahead first; explained, the
      // second answer is what it would then choose (on today's load).
      a = pick_again(*vm_, candidates, ctx, hashes_);
      explained_.rechecked = true;
    }
    explained_.outcome = to_string(a.status);
    explained_.error = a.error;
    explained_.log = vm_->take_log();
    vm_->explain_candidates(candidates, ctx, hashes_, explained_);
    last_cached_ = a.cached_tokens;
    switch (a.status) {
      case PickStatus::chosen:
        return candidates[a.index];
      case PickStatus::rejected:
        refusal_ = a.refusal;
        failed_closed_ = true;
        return nullptr;
      default:
        break;
    }
    if (vm_->fail_closed(ctx.stage)) {
      failed_closed_ = true;
      refusal_.emplace();
      refusal_->reason = to_string(a.status);
      refusal_->message = a.error;
      return nullptr;
    }
    explained_.fallback = true;
    return fallback_.peek(candidates, ctx);
  }

  bool on_request(const RequestHookInput& in, RequestDecision& out) override {
    begin(static_cast<int>(Stage::decode));
    if (!vm_->has_on_request())
      return false;
    const HookAnswer a = vm_->on_request(in, out, hashes_);
    explained_.outcome = to_string(a.status);
    explained_.error = a.error;
    explained_.log = vm_->take_log();
    if (a.status == HookStatus::accepted || a.status == HookStatus::rejected)
      return true;
    // As a worker's picker: a failed hook decided nothing.
    out = RequestDecision{};
    out.failed_closed = vm_->fail_closed(Stage::decode);
    out.error = a.error;
    return true;
  }

  bool failed_closed() const override { return failed_closed_; }
  const PickRefusal* last_refusal() const override { return refusal_ ? &*refusal_ : nullptr; }
  std::int64_t last_pick_cached_tokens() const override { return last_cached_; }
  const PickExplanation* last_explanation() const override { return &explained_; }

 private:
  void begin(int stage) {
    failed_closed_ = false;
    refusal_.reset();
    last_cached_ = 0;
    explained_ = PickExplanation{};
    const PolicySource& src = bundle_->stages[static_cast<std::size_t>(stage)];
    explained_.policy = policy_label(src.spec);
    explained_.version = policy_version(src.text);
  }

  std::shared_ptr<PolicyEngine> engine_;
  std::shared_ptr<const PolicyBundle> bundle_;
  std::unique_ptr<LuaVm> vm_;
  RoundRobinPicker fallback_;
  PrefixHashCache hashes_;
  PickExplanation explained_;
  bool failed_closed_ = false;
  std::optional<PickRefusal> refusal_;
  std::int64_t last_cached_ = 0;
};

}  // namespace

// --- PolicyEngine -------------------------------------------------------------

Result<std::unique_ptr<InstancePicker>> PolicyEngine::make_dry_picker(const InstanceSet& set) {
  const auto b = bundle();
  VmServices svc = services();
  svc.dry = true;
  auto vm = LuaVm::create(*b, svc);
  if (!vm)
    return fail(vm.error());
  for (const Stage s : {Stage::encode, Stage::prefill, Stage::decode})
    (*vm)->prime(s, set.for_stage(s));
  return std::unique_ptr<InstancePicker>(
      std::make_unique<DryPicker>(shared_from_this(), b, std::move(*vm)));
}

PolicyEngine::PolicyEngine(PolicySettings settings, std::shared_ptr<KvLocationIndex> kv_index)
    : settings_(std::move(settings)),
      kv_index_(kv_index ? std::move(kv_index) : std::make_shared<LocalKvIndex>()) {
  services_.budget = settings_.budget;
  services_.memory_limit = settings_.memory_limit;
  services_.prefix_block_bytes = settings_.prefix_block_bytes;
  services_.log_levels = log_levels_of(settings_);
  // Writes a policy's lines at its own level (--policy-log-level), past
  // the global one: the same sinks and format as every other line.
  services_.logger = spdlog::default_logger()->clone("pdgate");
  services_.logger->set_level(spdlog::level::trace);
  services_.kv = &kv_;
  services_.kv_index = kv_index_.get();
  services_.watchdog = &watchdog_;
  services_.metrics = &policy_metrics_;
  services_.module_text = [](std::string_view name) -> const char* {
    for (const auto& sp : shipped_policies()) {
      if (name == sp.name)
        return sp.text;
    }
    return nullptr;
  };
}

void PolicyEngine::set_exact_kv(std::shared_ptr<const KvBlockIndex> index,
                                std::shared_ptr<const Tokenizer> tokenizer) {
  std::lock_guard lock(mu_);
  block_index_ = std::move(index);
  tokenizer_ = std::move(tokenizer);
  services_.block_index = block_index_.get();
  services_.tokenizer = tokenizer_.get();
}

Result<std::shared_ptr<PolicyEngine>> PolicyEngine::create(
    PolicySettings settings, std::shared_ptr<KvLocationIndex> kv_index) {
  std::shared_ptr<PolicyEngine> e(new PolicyEngine(settings, std::move(kv_index)));
  auto b = e->build(settings);
  if (!b)
    return fail(b.error());
  e->bundle_ = std::move(*b);
  e->stamps_ = stamps_of(*e->bundle_);
  e->generation_.store(e->bundle_->generation, std::memory_order_release);
  return e;
}

Result<std::shared_ptr<const PolicyBundle>> PolicyEngine::build(const PolicySettings& s,
                                                                std::string* failed) {
  auto bundle = std::make_shared<PolicyBundle>();
  for (int i = 0; i < 3; ++i) {
    auto src = resolve_policy(s.specs[i], s.dir);
    if (!src) {
      if (failed != nullptr)
        *failed = policy_label(s.specs[i]);
      return fail(std::string(to_string(static_cast<Stage>(i))) + " policy: " + src.error());
    }
    bundle->stages[i] = std::move(*src);
  }
  // A load or self-check error names the script by its origin.
  const auto blame = [&](const std::string& error) {
    if (failed == nullptr)
      return;
    for (int i = 0; i < 3; ++i) {
      if (error.find(bundle->stages[i].origin) != std::string::npos) {
        *failed = policy_label(s.specs[i]);
        return;
      }
    }
    *failed = policy_label(s.specs[static_cast<int>(Stage::decode)]);
  };
  bundle->generation = generation_.load() + 1;
  VmServices svc = services_;
  svc.budget = s.budget;
  svc.memory_limit = s.memory_limit;
  svc.prefix_block_bytes = s.prefix_block_bytes;
  svc.log_levels = log_levels_of(s);
  auto vm = LuaVm::create(*bundle, svc);
  if (!vm) {
    blame(vm.error());
    return fail(vm.error());
  }
  if (auto ok = (*vm)->self_check(); !ok) {
    blame(ok.error());
    return fail(ok.error());
  }
  return std::shared_ptr<const PolicyBundle>(std::move(bundle));
}

std::vector<PolicyEngine::FileStamp> PolicyEngine::stamps_of(const PolicyBundle& b) {
  std::vector<FileStamp> out;
  for (const auto& s : b.stages) {
    if (s.origin.starts_with("builtin:"))
      continue;
    FileStamp st;
    st.path = s.origin;
    std::error_code ec;
    st.mtime = fs::last_write_time(st.path, ec);
    st.size = fs::file_size(st.path, ec);
    out.push_back(std::move(st));
  }
  return out;
}

Result<bool> PolicyEngine::reload() {
  return reload(settings());
}

Result<bool> PolicyEngine::reload(PolicySettings settings) {
  return reload(std::move(settings), "reload");
}

Result<bool> PolicyEngine::reload(PolicySettings settings, const char* trigger) {
  std::lock_guard lock(mu_);
  std::string failed;
  auto b = build(settings, &failed);
  if (!b) {
    stats_.reload_failures.fetch_add(1, std::memory_order_relaxed);
    // One series per policy name ever configured: bounded by the config.
    ++reload_failures_by_policy_[failed];
    last_reload_error_ = {b.error(), failed, trigger, wall_now_ms()};
    spdlog::error("policy reload rejected ({}), version {} stays: {}", trigger, generation_.load(),
                  b.error());
    return fail(b.error());
  }
  last_reload_error_ = {};
  // Budget and memory apply to states built from now on.
  services_.budget = settings.budget;
  services_.memory_limit = settings.memory_limit;
  services_.prefix_block_bytes = settings.prefix_block_bytes;
  services_.log_levels = log_levels_of(settings);
  settings_ = std::move(settings);
  bundle_ = std::move(*b);
  stamps_ = stamps_of(*bundle_);
  generation_.store(bundle_->generation, std::memory_order_release);
  stats_.reloads.fetch_add(1, std::memory_order_relaxed);
  spdlog::info("policies reloaded (version {}): encode {}, prefill {}, decode {}",
               bundle_->generation, bundle_->stages[0].origin, bundle_->stages[1].origin,
               bundle_->stages[2].origin);
  return true;
}

std::optional<Result<bool>> PolicyEngine::reload_if_changed() {
  {
    std::lock_guard lock(mu_);
    bool changed = false;
    for (auto& st : stamps_) {
      std::error_code ec;
      const auto mtime = fs::last_write_time(st.path, ec);
      const auto size = fs::file_size(st.path, ec);
      if (ec)
        continue;  // being replaced (rename-over); the next poll sees it
      if (mtime != st.mtime || size != st.size) {
        changed = true;
        // Remember what was tried, so a file that fails to load is not
        // retried (and logged) on every poll until it changes again.
        st.mtime = mtime;
        st.size = size;
      }
    }
    if (!changed)
      return std::nullopt;
  }
  return reload(settings(), "file");
}

namespace {

// "2026-11-24T20:41:03Z" for a file time or a wall-clock millisecond.
std::string iso_utc(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

std::string PolicyEngine::status_json() const {
  std::lock_guard lock(mu_);
  nlohmann::json stages = nlohmann::json::object();
  for (int i = 0; i < 3; ++i) {
    const PolicySource& src = bundle_->stages[i];
    nlohmann::json st = {{"policy", policy_label(src.spec)},
                         {"origin", src.origin},
                         {"version", policy_version(src.text)}};
    if (!src.origin.starts_with("builtin:")) {
      std::error_code ec;
      const auto t = fs::last_write_time(src.origin, ec);
      if (!ec) {
        st["file_time"] = iso_utc(std::chrono::time_point_cast<std::chrono::system_clock::duration>(
            std::chrono::file_clock::to_sys(t)));
      }
    }
    stages[to_string(static_cast<Stage>(i))] = std::move(st);
  }
  nlohmann::json last = nullptr;
  if (!last_reload_error_.error.empty()) {
    last = {{"error", last_reload_error_.error},
            {"policy", last_reload_error_.policy},
            {"trigger", last_reload_error_.trigger},
            {"at", iso_utc(std::chrono::system_clock::time_point(
                       std::chrono::milliseconds(last_reload_error_.wall_ms)))}};
  }
  nlohmann::json j = {{"generation", bundle_->generation},
                      {"stages", stages},
                      {"reloads", stats_.reloads.load()},
                      {"reload_failures", stats_.reload_failures.load()},
                      {"last_reload_error", last}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void PolicyEngine::write_reload_metrics(PrometheusText& m) const {
  std::lock_guard lock(mu_);
  m.counter("pdgate_policy_reload_failures_total",
            "Policy reloads rejected (file change, SIGHUP or the admin API), by the policy at "
            "fault; the running version stayed.");
  for (const auto& [policy, n] : reload_failures_by_policy_)
    m.sample("pdgate_policy_reload_failures_total", {{"policy", policy}}, n);
}

std::shared_ptr<const PolicyBundle> PolicyEngine::bundle() const {
  std::lock_guard lock(mu_);
  return bundle_;
}

VmServices PolicyEngine::services() const {
  std::lock_guard lock(mu_);
  return services_;
}

PolicySettings PolicyEngine::settings() const {
  std::lock_guard lock(mu_);
  return settings_;
}

std::unique_ptr<InstancePicker> PolicyEngine::make_picker(std::size_t worker_index) {
  return std::make_unique<LuaPicker>(shared_from_this(), worker_index);
}

PickerFactory PolicyEngine::factory() {
  auto self = shared_from_this();
  return [self](std::size_t worker) { return self->make_picker(worker); };
}

void PolicyEngine::log_limited(const std::string& kind, const std::string& message) {
  const auto now = std::chrono::steady_clock::now();
  std::uint64_t held = 0;
  {
    std::lock_guard lock(log_mu_);
    LogState& st = log_state_[kind];
    if (now - st.last < std::chrono::seconds(1)) {
      ++st.held;
      return;
    }
    st.last = now;
    held = st.held;
    st.held = 0;
  }
  if (held > 0) {
    spdlog::warn("{} (and {} more like it in the last second)", message, held);
  } else {
    spdlog::warn("{}", message);
  }
}

// --- Reload triggers ------------------------------------------------------------

namespace {

void poll_files(std::shared_ptr<net::steady_timer> timer, std::shared_ptr<PolicyEngine> engine,
                std::chrono::milliseconds interval) {
  timer->expires_after(interval);
  timer->async_wait([timer, engine, interval](const boost::system::error_code& ec) {
    if (ec)
      return;
    (void)engine->reload_if_changed();
    poll_files(timer, engine, interval);
  });
}

}  // namespace

void start_policy_file_watch(boost::asio::io_context& ioc, std::shared_ptr<PolicyEngine> engine,
                             std::chrono::milliseconds poll_interval) {
  poll_files(std::make_shared<net::steady_timer>(ioc), std::move(engine), poll_interval);
}

}  // namespace pdgate::policy
