// The request bodies of the P/D handshake as the connectors send them,
// exactly as vLLM's proxies build them: a prefill copy that computes one
// token (and, with NIXL, exports its KV blocks), a decode copy (that, with
// NIXL, imports them), the one-hop copy. Bodies are edited in place
// (core/base/json_body.hpp), never re-serialized.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/base/json_body.hpp"
#include "core/base/json_edit.hpp"
#include "core/routing/kv_params.hpp"

namespace pdgate {

// Prefill body: the client's body with stream:false, max_tokens:1,
// max_completion_tokens:1 (only if present; `fields` names both),
// min_tokens, min_completion_tokens, stream_options and conversation_id
// removed, and kv_transfer_params replaced by `kv_params_raw` (raw JSON text).
std::string make_prefill_body(std::string_view body, const JsonObjectIndex& index,
                              std::string_view kv_params_raw = kDefaultPrefillKvParams,
                              OneTokenFields fields = {});

// Decode body: the client's own body with conversation_id and any
// client-sent kv_transfer_params removed, and kv_transfer_params set to the
// prefill's raw params when given and not `null`.
std::string make_decode_body(std::string_view body, const JsonObjectIndex& index,
                             std::optional<std::string_view> kv_params_raw);

// One-hop body (combined P+D or connector none): the client's body with
// conversation_id and client-sent kv_transfer_params removed.
std::string make_passthrough_body(std::string_view body, const JsonObjectIndex& index);

// The same three bodies as slices of the client's `body` plus the edited
// fragments (core/base/json_body.hpp), for sending without copying the prompt.
// `body` must outlive the result. Concatenated, each is byte for byte what
// the make_* function above returns.
SplicedText splice_prefill_body(std::string_view body, const JsonObjectIndex& index,
                                std::string_view kv_params_raw = kDefaultPrefillKvParams,
                                OneTokenFields fields = {});
SplicedText splice_decode_body(std::string_view body, const JsonObjectIndex& index,
                               std::optional<std::string_view> kv_params_raw);
SplicedText splice_passthrough_body(std::string_view body, const JsonObjectIndex& index);
// A prefill body for connectors that pass no params (LMCache, P2P NCCL):
// as the prefill body, with any client-sent kv_transfer_params removed.
SplicedText splice_one_token_body(std::string_view body, const JsonObjectIndex& index,
                                  OneTokenFields fields = {});

}  // namespace pdgate
