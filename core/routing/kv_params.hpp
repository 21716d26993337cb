// The kv_transfer_params of the prefill -> decode handshake (NIXL's,
// docs/protocol): what the gateway asks a prefill for, what it reads from
// the prefill's answer, and how a decode's params become the next turn's
// prefill params (multi-turn reuse). The bodies that carry them are the
// connectors' (plugins/kv_bodies.hpp).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/base/result.hpp"

namespace pdgate {

// What the prefill asks for when the conversation has nothing cached: "send
// my blocks to a decode", with every remote field unknown.
inline constexpr std::string_view kDefaultPrefillKvParams =
    R"({"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,)"
    R"("remote_block_ids":null,"remote_host":null,"remote_port":null})";

// The raw text of a response's top-level kv_transfer_params (nullopt when
// absent or null). Fails when the response is not a JSON object or the
// params are neither an object nor null.
Result<std::optional<std::string>> extract_kv_params(std::string_view response_body);

// The params a decode returned at the end of a turn, rewritten for the next
// turn's prefill: remote_host set to the decode's host, do_remote_decode
// true, do_remote_prefill false. Every other byte is kept (block ids,
// engine id, unknown fields). Fails unless `decode_params_raw` is an object.
Result<std::string> kv_params_for_next_turn_prefill(std::string_view decode_params_raw,
                                                    std::string_view decode_host);

}  // namespace pdgate
