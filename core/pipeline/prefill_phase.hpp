// The prefill phase: the prefill engine computes the prompt's KV cache
// (max_tokens 1) and, with NIXL, answers with the kv_transfer_params that
// let a decode pull it; the other connectors move the cache out of band.
#pragma once

#include <optional>
#include <string_view>

#include <boost/asio/awaitable.hpp>

#include "core/net/errors.hpp"
#include "core/pipeline/request_context.hpp"

namespace pdgate {

// Runs the phase, failing over to other prefill instances: takes the
// conversation's previous-turn params (multi-turn reuse), picks the decode
// first when the connector names both peers, and leaves rc.prefill,
// rc.stage_id and rc.decode_body for decode. Not for one hop (no prefill).
net::awaitable<bool> prefill_phase(RequestContext& rc);

// One prefill with failover, asking it for `params` (the default "export
// your blocks" ones, or a previous turn's); the decode phase calls it again
// when a decode failed after it may have pulled the first prefill's blocks.
net::awaitable<std::optional<GatewayError>> prefill_with_failover(RequestContext& rc,
                                                                  std::string_view params);

}  // namespace pdgate
