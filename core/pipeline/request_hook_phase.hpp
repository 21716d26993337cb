// The request hook phase of the pipeline (core/pipeline/pipeline.cpp): after the
// request is validated and before anything is routed, the policy's
// on_request (docs/policies.md) may reject it, edit its upstream headers
// and a few body fields, and choose its path. No I/O: it runs at once.
#pragma once

#include <optional>
#include <vector>

#include "core/net/errors.hpp"
#include "core/pipeline/forwarded_headers.hpp"
#include "core/pipeline/request_context.hpp"
#include "core/routing/request_hook.hpp"

namespace pdgate {

// The error to answer with (the policy's rejection, or 503 when a
// fail-closed hook failed), else nothing: the request goes on as decided.
bool request_hook_phase(RequestContext& rc);

// The path the request takes: the hook's choice where the connector
// allows it. p2p-nccl engines find their peer from the request id, and a
// vLLM decode (kv_consumer) without one waits for a prefill that never
// comes, so its requests keep the configured path. True: one hop.
bool one_hop_for(const Config& cfg, const KvConnector& connector, RoutePath chosen);

// What the client gets when the hook's decision ends the request (its
// refusal, or 503 when a fail-closed hook failed); nothing when it goes
// on. Moves the refusal's message and headers out of `d`.
std::optional<GatewayError> hook_refusal(RequestDecision& d);

// Makes `edited` (the request's body with a few fields changed) the body
// every later phase reads: re-indexed, and the views into the body moved
// to it. False (and the request failed with an internal error) if the edit
// broke the JSON, which splicing into a valid object cannot do.
bool use_edited_body(RequestContext& rc, std::string edited, const char* what);

// Applies header edits to what every engine request of this client
// request carries. Edits failing header_edit_error() are skipped (the
// policy engine refuses them before they get here).
void apply_header_edits(ForwardedHeaders& fwd, const std::vector<HeaderEdit>& edits);

}  // namespace pdgate
