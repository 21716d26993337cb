#include "core/gateway/health_report.hpp"

#include <algorithm>

#include <string>

namespace pdgate {

namespace http = boost::beast::http;
using json = nlohmann::json;

namespace {

enum class RoleState { healthy, unhealthy, empty };

const char* to_string(RoleState s) {
  switch (s) {
    case RoleState::healthy:
      return "healthy";
    case RoleState::unhealthy:
      return "unhealthy";
    case RoleState::empty:
      return "empty";
  }
  return "?";
}

RoleState state_of(const std::vector<InstancePtr>& candidates) {
  if (candidates.empty())
    return RoleState::empty;
  for (const auto& i : candidates) {
    if (i->healthy.load(std::memory_order_relaxed))
      return RoleState::healthy;
  }
  return RoleState::unhealthy;
}

struct Verdict {
  RoleState encode, prefill, decode;
  std::string reason;  // empty: ready
};

Verdict judge(const InstanceSet& set, RequiredRoles required, bool stopping) {
  Verdict v{state_of(set.encode), state_of(set.prefill), state_of(set.decode), {}};
  const std::pair<const char*, std::pair<bool, RoleState>> roles[] = {
      {"encode", {required.encode, v.encode}},
      {"prefill", {required.prefill, v.prefill}},
      {"decode", {required.decode, v.decode}},
  };
  for (const auto& [name, r] : roles) {
    if (r.first && r.second != RoleState::healthy && v.reason.empty())
      v.reason = std::string(name) + " has no healthy instance (" + to_string(r.second) + ")";
  }
  if (stopping)
    v.reason = "shutting down";
  return v;
}

}  // namespace

RequiredRoles RequiredRoles::from(const Config& cfg) {
  RequiredRoles r;
  r.encode =
      !cfg.encode.empty() || std::any_of(cfg.dns_sources.begin(), cfg.dns_sources.end(),
                                         [](const DnsSource& d) { return d.role == Role::encode; });
  r.prefill = !cfg.prefill_disabled && cfg.kv_connector != "none";
  return r;
}

std::pair<http::status, json> health_report(const InstanceSet& set, RequiredRoles required,
                                            bool stopping, bool verbose) {
  const Verdict v = judge(set, required, stopping);
  json j = {{"status", v.reason.empty() ? "ok" : "unhealthy"},
            {"encode_cluster", to_string(v.encode)},
            {"prefill_cluster", to_string(v.prefill)},
            {"decode_cluster", to_string(v.decode)}};
  if (!v.reason.empty())
    j["reason"] = v.reason;
  auto instances = json::array();
  for (const auto& i : set.all()) {
    json e = {{"id", i->id}, {"role", to_string(i->spec.role)}, {"state", to_string(i->state())}};
    if (verbose)
      e["url"] = i->spec.url;
    instances.push_back(std::move(e));
  }
  j["instances"] = std::move(instances);
  return {v.reason.empty() ? http::status::ok : http::status::service_unavailable, std::move(j)};
}

std::pair<http::status, json> readiness(const InstanceSet& set, RequiredRoles required,
                                        bool stopping) {
  const Verdict v = judge(set, required, stopping);
  if (v.reason.empty())
    return {http::status::ok, {{"status", "ready"}}};
  return {http::status::service_unavailable, {{"status", "not ready"}, {"reason", v.reason}}};
}

}  // namespace pdgate
