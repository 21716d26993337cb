// Parallel legs (Mooncake, --kv-connector mooncake): prefill and decode
// are sent at the same time under a transfer id the gateway mints; decode
// waits, in the engine, for prefill's KV, so the decode leg does not wait
// for prefill's answer. The legs cancel each other: a prefill that fails
// aborts the decode leg that waits for its KV, a decode that fails aborts
// the prefill whose KV nobody will take, a client that leaves aborts both.
#pragma once

#include <memory>

#include <boost/asio/awaitable.hpp>

#include "core/pipeline/relay.hpp"
#include "core/pipeline/request_context.hpp"

namespace pdgate {

// Picks prefill (whose bootstrap server names its engine id) and decode,
// sends both legs, and returns the relay once decode's first bytes are in
// and the prefill leg ended; null with rc.failure set otherwise (prefill's
// failure when it caused decode's abort).
net::awaitable<std::unique_ptr<DecodeRelay>> parallel_legs_phase(RequestContext& rc);

}  // namespace pdgate
