// What GET /health, /readyz and /livez answer. Built from the state the
// health checker and the passive ejection keep (Instance::healthy), never
// by asking the engines: a probe of the gateway costs nothing upstream, so
// whoever can reach it cannot turn it into a request to every engine.
#pragma once

#include <utility>

#include <boost/beast/http/status.hpp>
#include <nlohmann/json.hpp>

#include "core/config/config.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

// A role is required when requests cannot be served without it: decode
// always, prefill unless requests go in one hop, encode when encoders were
// configured at start (a multimodal deployment).
struct RequiredRoles {
  bool encode = false;
  bool prefill = true;
  bool decode = true;
  static RequiredRoles from(const Config& cfg);
};

// /health: per role "healthy" (an active instance not ejected),
// "unhealthy" (instances, none usable) or "empty" (none); the status is
// 503 when a required role is not healthy or the gateway is shutting
// down. `verbose` adds the instances' URLs (they are internal addresses).
std::pair<boost::beast::http::status, nlohmann::json> health_report(const InstanceSet& set,
                                                                    RequiredRoles required,
                                                                    bool stopping, bool verbose);

// /readyz: the same verdict, and the reason when not ready.
std::pair<boost::beast::http::status, nlohmann::json> readiness(const InstanceSet& set,
                                                                RequiredRoles required,
                                                                bool stopping);

}  // namespace pdgate
