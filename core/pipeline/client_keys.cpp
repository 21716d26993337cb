#include "core/pipeline/client_keys.hpp"

#include <fstream>
#include <sstream>
#include <utility>

#include <algorithm>
#include <cmath>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "core/base/sha256.hpp"
#include "core/base/text.hpp"
#include "core/config/config.hpp"

namespace pdgate {

namespace {

using Clock = std::chrono::steady_clock;

double steady_ms() {
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
}

// The fields one key may have, from YAML or JSON alike: `get(name)` yields
// the field's text (nullopt when absent), `labels()` the label map.
template <typename Get, typename Labels>
Result<ClientKey> read_key(Get get, Labels labels) {
  ClientKey k;
  auto name = get("name");
  if (!name || trim(*name).empty())
    return fail("needs a name");
  k.name = std::string(trim(*name));
  if (k.name.size() > kMaxKeyNameBytes) {
    return fail("the name is longer than " + std::to_string(kMaxKeyNameBytes) + " bytes (" +
                std::to_string(k.name.size()) + ")");
  }
  auto number = [&](const char* field, double max) -> Result<double> {
    auto v = get(field);
    if (!v)
      return 0.0;
    char* end = nullptr;
    const std::string text(trim(*v));
    const double d = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(d) || d < 0 || d > max)
      return fail(std::string(field) + " must be a number from 0 to " +
                  std::to_string(static_cast<long long>(max)));
    return d;
  };
  auto rps = number("requests_per_second", 1e6);
  auto burst = number("burst", 1e6);
  auto conc = number("concurrent", 1e6);
  auto tpm = number("tokens_per_minute", 1e15);
  for (auto* r : {&rps, &burst, &conc, &tpm}) {
    if (!*r)
      return fail(r->error());
  }
  k.limits.requests_per_second = *rps;
  k.limits.burst = *burst;
  k.limits.concurrent = static_cast<std::uint32_t>(*conc);
  k.limits.tokens_per_minute = static_cast<std::uint64_t>(*tpm);
  auto l = labels();
  if (!l)
    return fail(l.error());
  if (auto why = label_problem(*l, "key"))
    return fail(*why);
  k.labels = std::move(*l);
  return k;
}

// A count past the bound is refused before the labels are copied.
Failure too_many_labels(std::size_t n) {
  return fail("at most " + std::to_string(LabelLimits::kMaxCount) + " labels per key (got " +
              std::to_string(n) + ")");
}

}  // namespace

bool is_key_hash(std::string_view hex) {
  return hex.size() == 64 && std::all_of(hex.begin(), hex.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

double KeyLimits::bucket() const {
  if (burst > 0)
    return burst;
  return std::max(1.0, requests_per_second);
}

Result<KeyTable> parse_key_file(std::string_view yaml_text) {
  KeyTable table;
  try {
    const YAML::Node root = YAML::Load(std::string(yaml_text));
    const YAML::Node keys = root.IsMap() ? root["keys"] : YAML::Node();
    if (!keys || !keys.IsSequence())
      return fail("the key file needs a 'keys' list");
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const YAML::Node& n = keys[i];
      const std::string where = "key " + std::to_string(i + 1);
      if (!n.IsMap())
        return fail(where + ": expected a map (name, sha256, limits)");
      for (const auto& kv : n) {
        static const char* known[] = {
            "name",  "sha256",     "labels",           "requests_per_second",
            "burst", "concurrent", "tokens_per_minute"};
        const auto field = kv.first.as<std::string>();
        if (std::find(std::begin(known), std::end(known), field) == std::end(known))
          return fail(where + ": unknown field '" + field + "'");
      }
      auto get = [&](const char* field) -> std::optional<std::string> {
        const YAML::Node v = n[field];
        if (!v || !v.IsScalar())
          return std::nullopt;
        return v.as<std::string>();
      };
      auto labels = [&]() -> Result<std::map<std::string, std::string>> {
        std::map<std::string, std::string> out;
        const YAML::Node v = n["labels"];
        if (!v)
          return out;
        if (!v.IsMap())
          return fail("labels must be a map");
        if (v.size() > LabelLimits::kMaxCount)
          return too_many_labels(v.size());
        for (const auto& kv : v)
          out[kv.first.as<std::string>()] = kv.second.as<std::string>();
        return out;
      };
      auto key = read_key(get, labels);
      if (!key)
        return fail(where + ": " + key.error());
      auto hash = get("sha256");
      const std::string hex = hash ? lower(trim(*hash)) : std::string();
      if (!is_key_hash(hex))
        return fail(where + " (" + key->name +
                    "): sha256 must be 64 hex digits, the SHA-256 of "
                    "the key (printf %s KEY | sha256sum)");
      if (table.count(hex))
        return fail(where + " (" + key->name + "): the same key is listed twice");
      table.emplace(hex, std::make_shared<const ClientKey>(std::move(*key)));
    }
  } catch (const YAML::Exception& e) {
    return fail(std::string("the key file is not valid YAML: ") + e.what());
  }
  return table;
}

Result<ClientKeyPtr> parse_key_json(std::string_view json_text) {
  if (json_text.size() > kMaxKeyJsonBytes) {
    return fail("the key's JSON is longer than " + std::to_string(kMaxKeyJsonBytes) + " bytes (" +
                std::to_string(json_text.size()) + ")");
  }
  const auto j = nlohmann::json::parse(json_text, nullptr, false);
  if (!j.is_object())
    return fail("not a JSON object");
  auto get = [&](const char* field) -> std::optional<std::string> {
    auto it = j.find(field);
    if (it == j.end() || it->is_null())
      return std::nullopt;
    return it->is_string() ? it->get<std::string>() : it->dump();
  };
  auto labels = [&]() -> Result<std::map<std::string, std::string>> {
    std::map<std::string, std::string> out;
    auto it = j.find("labels");
    if (it == j.end())
      return out;
    if (!it->is_object())
      return fail("labels must be an object");
    if (it->size() > LabelLimits::kMaxCount)
      return too_many_labels(it->size());
    for (const auto& [k, v] : it->items()) {
      if (!v.is_string())
        return fail("label values must be strings");
      out[k] = v.get<std::string>();
    }
    return out;
  };
  auto key = read_key(get, labels);
  if (!key)
    return fail(key.error());
  return std::make_shared<const ClientKey>(std::move(*key));
}

std::string_view bearer_token(std::string_view authorization) {
  authorization = trim(authorization);
  if (authorization.size() < 7 || lower(authorization.substr(0, 7)) != "bearer ")
    return {};
  return trim(authorization.substr(7));
}

RateStep gcra_step(double tat_ms, double now_ms, double per_second, double bucket) {
  const double interval = 1000.0 / per_second;
  const double tat = std::max(tat_ms, now_ms);
  const double next = tat + interval;
  // Room for `bucket` requests: the next one may start once the backlog
  // (next - now) is at most bucket intervals.
  const double allow_at = next - bucket * interval;
  if (allow_at > now_ms)
    return {false, tat_ms, static_cast<std::int64_t>(std::ceil(allow_at - now_ms))};
  return {true, next, 0};
}

Result<KeyTable> read_key_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  auto table = in ? parse_key_file(text.str()) : Result<KeyTable>(fail("cannot read the file"));
  if (!table)
    return fail("--api-keys " + path + ": " + table.error());
  return table;
}

ClientKeys::ClientKeys(KeyTable file_keys, bool fail_open)
    : file_keys_(std::make_shared<const KeyTable>(std::move(file_keys))),
      shared_keys_(std::make_shared<const KeyTable>()),
      fail_open_(fail_open) {}

ClientKeyPtr ClientKeys::find(std::string_view presented) const {
  if (presented.empty())
    return nullptr;
  const auto hex = sha256_hex(presented);
  if (!hex)
    return nullptr;
  std::shared_ptr<const KeyTable> file, shared;
  {
    std::lock_guard lock(mu_);
    file = file_keys_;
    shared = shared_keys_;
  }
  if (auto it = file->find(*hex); it != file->end())
    return it->second;
  auto it = shared->find(*hex);
  return it == shared->end() ? nullptr : it->second;
}

void ClientKeys::set_shared_keys(KeyTable shared) {
  auto next = std::make_shared<const KeyTable>(std::move(shared));
  std::lock_guard lock(mu_);
  shared_keys_ = std::move(next);
}

ClientKeys::FileKeyChanges ClientKeys::replace_file_keys(KeyTable keys) {
  auto next = std::make_shared<const KeyTable>(std::move(keys));
  std::shared_ptr<const KeyTable> old;
  {
    std::lock_guard lock(mu_);
    old = std::exchange(file_keys_, next);
  }
  FileKeyChanges c;
  for (const auto& [hex, key] : *next) {
    const auto it = old->find(hex);
    if (it == old->end())
      ++c.added;
    else if (!(*it->second == *key))
      ++c.changed;
  }
  for (const auto& [hex, key] : *old)
    c.removed += next->count(hex) == 0 ? 1 : 0;
  return c;
}

KeyStats& ClientKeys::stats_for(const ClientKey& key) {
  {
    std::shared_lock lock(stats_mu_);
    if (auto it = stats_.find(key.name); it != stats_.end())
      return *it->second;
  }
  std::unique_lock lock(stats_mu_);
  if (auto it = stats_.find(key.name); it != stats_.end())
    return *it->second;
  if (stats_.size() >= kMaxKeySeries || key.name == kOtherKeys) {
    other_used_.store(true, std::memory_order_relaxed);
    return other_stats_;
  }
  return *stats_.emplace(key.name, std::make_unique<KeyStats>()).first->second;
}

void ClientKeys::for_each_key_stats(
    const std::function<void(const std::string& name, const KeyStats&)>& fn) const {
  std::vector<std::pair<std::string, const KeyStats*>> rows;
  {
    std::shared_lock lock(stats_mu_);
    rows.reserve(stats_.size());
    for (const auto& [name, st] : stats_)
      rows.emplace_back(name, st.get());
  }
  std::sort(rows.begin(), rows.end());
  for (const auto& [name, st] : rows)
    fn(name, *st);
  if (other_used_.load(std::memory_order_relaxed))
    fn(std::string(kOtherKeys), other_stats_);
}

std::size_t ClientKeys::size() const {
  std::lock_guard lock(mu_);
  std::size_t n = file_keys_->size();
  for (const auto& [hex, k] : *shared_keys_)
    n += file_keys_->count(hex) ? 0 : 1;
  return n;
}

void TokenWindow::expire(std::int64_t second) {
  while (!buckets_.empty() && buckets_.front().first <= second - kSpanSeconds) {
    sum_ -= buckets_.front().second;
    buckets_.pop_front();
  }
}

std::uint64_t TokenWindow::used(double now_ms) {
  expire(static_cast<std::int64_t>(std::floor(now_ms / 1000.0)));
  return sum_;
}

void TokenWindow::add(double now_ms, std::uint64_t tokens) {
  if (tokens == 0)
    return;
  const auto second = static_cast<std::int64_t>(std::floor(now_ms / 1000.0));
  expire(second);
  if (buckets_.empty() || buckets_.back().first < second)
    buckets_.emplace_back(second, 0);
  buckets_.back().second += tokens;
  sum_ += tokens;
}

std::int64_t TokenWindow::wait_below_ms(double now_ms, std::uint64_t limit) const {
  std::uint64_t left = sum_;
  for (const auto& [second, tokens] : buckets_) {
    if (left < limit)
      break;
    left -= tokens;
    // The bucket leaves the window when its second is kSpanSeconds old.
    if (left < limit) {
      const double at = static_cast<double>(second + kSpanSeconds) * 1000.0;
      return std::max<std::int64_t>(0, static_cast<std::int64_t>(std::ceil(at - now_ms)));
    }
  }
  return 0;
}

bool tokens_fit(std::uint64_t limit, std::uint64_t used, std::uint64_t reserved,
                std::uint64_t reserve) {
  if (used >= limit)
    return false;
  return reserved == 0 || used + reserved + reserve <= limit;
}

Admission LocalLimits::admit(const ClientKey& key, std::string_view /*request_id*/, double now_ms,
                             std::uint64_t reserve) {
  const KeyLimits& l = key.limits;
  std::lock_guard lock(mu_);
  State& s = by_key_[key.name];
  if (l.tokens_per_minute > 0 &&
      !tokens_fit(l.tokens_per_minute, s.tokens.used(now_ms), s.reserved, reserve)) {
    // Spent: back when enough of the window's tokens have left it; else
    // room comes back as requests in flight end, which cannot be known.
    const auto wait = s.tokens.used(now_ms) >= l.tokens_per_minute
                          ? s.tokens.wait_below_ms(now_ms, l.tokens_per_minute)
                          : std::int64_t{1000};
    return {Admission::Verdict::limited, std::chrono::milliseconds(wait), "tokens", {}};
  }
  RateStep step{true, s.tat_ms, 0};
  if (l.requests_per_second > 0) {
    step = gcra_step(s.tat_ms, now_ms, l.requests_per_second, l.bucket());
    if (!step.allowed)
      return {
          Admission::Verdict::limited, std::chrono::milliseconds(step.retry_after_ms), "rate", {}};
  }
  if (l.concurrent > 0 && s.in_flight >= l.concurrent)
    return {Admission::Verdict::limited, std::chrono::milliseconds(1000), "concurrency", {}};
  s.tat_ms = step.tat_ms;
  ++s.in_flight;
  if (l.tokens_per_minute > 0)
    s.reserved += reserve;
  return {};
}

void LocalLimits::release(const ClientKey& key, std::uint64_t tokens, double now_ms,
                          std::uint64_t reserved) {
  std::lock_guard lock(mu_);
  State& s = by_key_[key.name];
  if (s.in_flight > 0)
    --s.in_flight;
  if (key.limits.tokens_per_minute > 0)
    s.reserved -= std::min(s.reserved, reserved);
  s.tokens.add(now_ms, tokens);
}

namespace {

class LocalLimiter final : public ClientLimiter {
 public:
  explicit LocalLimiter(LocalLimits& limits) : limits_(limits) {}
  net::awaitable<Admission> admit(const ClientKey& key, std::string_view request_id,
                                  std::uint64_t reserve) override {
    co_return limits_.admit(key, request_id, steady_ms(), reserve);
  }
  void release(const ClientKey& key, const std::string&, std::uint64_t tokens,
               std::uint64_t reserved) override {
    limits_.release(key, tokens, steady_ms(), reserved);
  }

 private:
  LocalLimits& limits_;
};

class LocalClientKeys final : public ClientKeys {
 public:
  explicit LocalClientKeys(KeyTable keys) : ClientKeys(std::move(keys), true) {}
  std::unique_ptr<ClientLimiter> make_limiter(net::any_io_executor) override {
    return std::make_unique<LocalLimiter>(limits_);
  }

 private:
  LocalLimits limits_;
};

}  // namespace

std::unique_ptr<ClientKeys> make_local_client_keys(KeyTable keys) {
  return std::make_unique<LocalClientKeys>(std::move(keys));
}

}  // namespace pdgate
