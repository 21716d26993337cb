// POST /admin/policy/explain (docs/admin.md): what the routing policies
// would do with a request, without sending anything to an engine. The
// request is read as the pipeline reads it (facts, conversation, headers,
// API key); the request hook, then each stage's pick, run in the order
// the pipeline runs them, on a dry picker (PolicyEngine::make_dry_picker,
// fresh for each call): what would change state (the policies' shared
// store, pdgate.rate, rotation counters, the KV-location index, counters)
// answers as it would and changes nothing, and no engine is contacted. The
// limits the hook declares (req:rate_limit) are read as the rate-limit
// phase would find them, and not counted.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include <boost/asio/awaitable.hpp>
#include "core/config/config.hpp"

#include "core/pipeline/client_keys.hpp"
#include "core/pipeline/rate_limit_phase.hpp"
#include "core/routing/kv_connector.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

struct ExplainEnv {
  const Config& cfg;
  const KvConnector& connector;
  const InstanceSet& set;
  const ClientKeys* keys = nullptr;  // null: --api-keys off
  // Where the hook's declared limits are read, without counting (with
  // --redis: Redis, as the workers check them); null: not checked.
  RateLimiter* rate_limiter = nullptr;
};

// The explain document's bounds: a request's headers (the admin API's
// body, 1 MiB, bounds the rest).
inline constexpr std::size_t kMaxExplainHeaders = 64;
inline constexpr std::size_t kMaxExplainHeaderValue = 8192;

// Reads `document` ({"headers": {...}, "body": {...} or "...", "path":
// "/v1/chat/completions"}), runs it through `dry` and answers the status
// (200, or 400 when the document cannot be read) and a JSON text: the
// explanation, or the error message.
// Awaits only the dry check of the hook's declared limits.
boost::asio::awaitable<std::pair<unsigned, std::string>> explain_request(std::string_view document,
                                                                         InstancePicker& dry,
                                                                         ExplainEnv env);

}  // namespace pdgate
