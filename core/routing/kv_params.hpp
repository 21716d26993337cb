// The kv_transfer_params of the prefill -> decode handshake (NIXL's,
// docs/protocol): what the gateway asks a prefill for, what it reads from
// the prefill's answer, and how a decode's params become the next turn's
// prefill params (multi-turn reuse). The bodies that carry them are the
// connectors' (plugins/kv_bodies.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/result.hpp"

namespace pdgate {

// The output-length fields a prefill leg sets to 1: `always` is set,
// `if_present` only when the client sent it. The Responses API names its
// limit max_output_tokens.
struct OneTokenFields {
  std::string_view always = "max_tokens";
  std::string_view if_present = "max_completion_tokens";
};

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

// Whether prefill's answer asks for NIXL's push form (vLLM's
// NixlPushConnectorScheduler answers transfer_mode "push"; the pull one
// answers "pull", older engines nothing).
bool answers_push(std::string_view answer_params_raw);

// Decode's params in NIXL's push form, from prefill's answer: do_remote_prefill
// true, do_remote_decode false, and prefill's remote_engine_id,
// remote_request_id, remote_host, remote_port and tp_size (values copied
// byte for byte), never remote_block_ids: decode registers with prefill,
// which writes the blocks. Fails naming the first field that is missing or
// null: vLLM's push decode indexes them and would fail the request.
Result<std::string> nixl_push_decode_params(std::string_view answer_params_raw);

// Mooncake's parallel legs (vLLM's mooncake_connector.py): what prefill is
// asked, and what decode gets, under one transfer id the gateway mints.
std::string mooncake_prefill_params(std::string_view transfer_id);
std::string mooncake_decode_params(std::string_view transfer_id, std::string_view bootstrap_addr,
                                   std::string_view remote_engine_id);

// One engine id per data-parallel rank, as Mooncake's bootstrap server
// answers GET /query: {"0": {"engine_id": "...", ...}, "1": ...}. The
// answer is untrusted: ranks are decimal below 4096, ids non-empty
// printable strings of at most 256 bytes, at most 1024 ranks; anything else
// fails. Sorted by rank.
struct RankEngineId {
  std::uint32_t rank = 0;
  std::string engine_id;
};
Result<std::vector<RankEngineId>> parse_mooncake_query(std::string_view answer);

}  // namespace pdgate
