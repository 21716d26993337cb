// The decode phase: decode gets the client's body with the prefill's
// params and is read until the client can be sent something (a stream's
// first event, a whole answer's body). Until then the client has received
// nothing, so every failure can still go to another decode.
#pragma once

#include <memory>
#include <optional>

#include <boost/asio/awaitable.hpp>

#include "core/net/errors.hpp"
#include "core/pipeline/relay.hpp"
#include "core/pipeline/request_context.hpp"

namespace pdgate {

// What the routing phases end with: the relay's state, or the error that
// answers the request.
struct Routed {
  std::unique_ptr<DecodeRelay> relay;
  // Set when there is no relay. Optional, so that a routed request does
  // not carry (and move, phase by phase) an empty error's strings.
  std::optional<GatewayError> error;
};

// Runs the phase, failing over to other decodes: one the request never
// reached with the same body; one that may have pulled the prefill's
// blocks after a fresh prefill. With p2p-nccl the decode was chosen before
// the prefill (the request id names both), so it is not retried.
net::awaitable<Routed> decode_phase(RequestContext& rc);

}  // namespace pdgate
