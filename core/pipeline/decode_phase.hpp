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

// One decode attempt's end: the relay's state, or the failure.
struct Routed {
  std::unique_ptr<DecodeRelay> relay;
  std::optional<GatewayError> error;
};

// One attempt on `decode`: the relay when decode answered 2xx and the
// client's first bytes are in, else the failure. Its connection is in
// `leg_scope` when given (a parallel prefill leg may abort it; the relay
// keeps the scope), else in rc.scope.
net::awaitable<Routed> attempt_decode(RequestContext& rc, const InstancePtr& decode,
                                      std::unique_ptr<LegScope> leg_scope);

// Decode answered: the time to first token is noted and the relay takes
// the request's view.
void note_decode_answered(RequestContext& rc, DecodeRelay& relay);

// Runs the phase, failing over to other decodes: one the request never
// reached with the same body; one that may have pulled the prefill's
// blocks after a fresh prefill. With p2p-nccl the decode was chosen before
// the prefill (the request id names both), so it is not retried.
// Returns the relay's state, or null with rc.failure set.
net::awaitable<std::unique_ptr<DecodeRelay>> decode_phase(RequestContext& rc);

}  // namespace pdgate
