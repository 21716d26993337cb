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

// Runs the phase, failing over to other decodes: one the request never
// reached with the same body; one that may have pulled the prefill's
// blocks after a fresh prefill. With p2p-nccl the decode was chosen before
// the prefill (the request id names both), so it is not retried.
// Returns the relay's state, or null with rc.failure set.
net::awaitable<std::unique_ptr<DecodeRelay>> decode_phase(RequestContext& rc);

}  // namespace pdgate
