// How an engine's failure becomes a GatewayError: what the client is
// told, whose fault it was and whether another instance may succeed.
// (errors.hpp's status_of() then decides the status, once for all.)
#pragma once

#include <boost/asio/awaitable.hpp>

#include "core/net/errors.hpp"
#include "core/upstream/instance.hpp"
#include "core/upstream/upstream.hpp"

namespace pdgate {

// What a client is told an upstream failure was, without the engine's
// address ("timed out waiting for the engine").
const char* public_reason(UpstreamFailure kind);

// An exchange with `inst` failed: "<stage> stage failed: <public reason>",
// the engine named only in the detail. Whose fault, and whether another
// instance may succeed, follow from the failure: a request that never
// reached the engine is retriable for free; the gateway's own shortage
// (out of descriptors) is not the engine's fault and not retried.
GatewayError upstream_failure(Stage stage, const UpstreamError& e);

// 503 "no healthy <stage> instance is available".
GatewayError no_instance(Stage stage);
// The same after `picker` returned no instance: 503 from the policy when
// it failed and is fail-closed.
GatewayError no_instance(Stage stage, const InstancePicker& picker);

// An engine answered with an error status: its own 4xx goes to the client
// verbatim (engine_rejected), a 5xx becomes a 502 naming the stage
// (engine_failed, retriable). Reads the error body.
net::awaitable<GatewayError> engine_status_error(Stage stage, UpstreamExchange& ex,
                                                 const Instance& inst);

}  // namespace pdgate
