// The prefill phase: the prefill engine computes the prompt's KV cache
// (max_tokens 1) and, with NIXL, answers with the kv_transfer_params that
// let a decode pull it; the other connectors move the cache out of band.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/awaitable.hpp>

#include "core/net/errors.hpp"
#include "core/pipeline/request_context.hpp"

namespace pdgate {

// One prefill leg's end.
struct PrefillAnswer {
  std::optional<GatewayError> error;
  InstancePtr instance;
  std::string request_id;
  SplicedText decode_body;  // the connector's, from this answer (sequential legs)
  // usage.prompt_tokens_details.cached_tokens of the answer: the prompt's
  // true cache hit (decode counts what it pulled as cached too).
  std::optional<std::uint64_t> cached_tokens;
  // usage.prompt_tokens: the prompt's length in tokens, which a stream
  // resumed elsewhere reports (its own prompt holds the answer so far).
  std::optional<std::uint64_t> prompt_tokens;
  // Its prompt_logprobs, when the client asked for them (whole answers).
  std::optional<std::string> prompt_logprobs;
};

// What a prefill pick tells a policy about pdgate.RECHECK (PickContext):
// how long the caller would wait before asking again (0: the picker asks
// again at once), or that this is the second pick.
struct RecheckTerms {
  std::chrono::milliseconds wait{0};
  bool second = false;
};

// The picker's prefill among those not tried yet (null: none, or, when
// `terms.wait` is not 0, picker.wants_recheck() may say to wait and pick
// again).
InstancePtr pick_prefill(RequestContext& rc, RecheckTerms terms = {});

// One prefill leg on `picked` (null: one the picker chooses), asking it
// for `params`, its connections in `scope` (rc.scope, or a child scope a
// parallel decode leg may abort).
net::awaitable<PrefillAnswer> run_prefill(RequestContext& rc, std::string_view params,
                                          RequestScope& scope, InstancePtr picked);

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
