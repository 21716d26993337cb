// The headers every engine call made for one client request carries from
// it, computed once per request: credentials, the Via chain, the trace
// context, who the client is, and the extra headers the configuration
// and the request hook name.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/beast/http.hpp>

#include "core/net/maybe_tls_stream.hpp"
#include "core/observability/tracing.hpp"
#include "core/pipeline/worker.hpp"

namespace pdgate {

// What every upstream request made for one client request carries from
// it: the credentials, the Via chain that lets gateways detect loops
// (core/net/loop_guard.hpp), the trace context (core/observability/tracing.hpp), who the
// client is (X-Forwarded-For, Forwarded) and the extra headers the
// configuration names (--forward-headers, --set-header).
struct ForwardedHeaders {
  std::string authorization;  // the client's, else the OPENAI_API_KEY default
  std::string via;
  std::string traceparent;  // of engine calls without a span of their own
  std::string tracestate;
  std::string baggage;
  std::string x_forwarded_for;
  std::string forwarded;
  // Names from the Config (which outlives every request), values copied.
  std::vector<std::pair<std::string_view, std::string>> extra;
  // Set by the request hook (core/pipeline/request_hook_phase.hpp).
  std::vector<std::pair<std::string, std::string>> policy_set;
};

// Computed once per client request; `client` is its connection (the
// peer's address goes into X-Forwarded-For and Forwarded).
ForwardedHeaders forwarded_headers(const WorkerContext& w,
                                   const http::request<http::string_body>& req,
                                   const MaybeTlsStream& client, const RequestTrace& trace);

}  // namespace pdgate
