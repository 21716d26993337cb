// The request bodies of the P/D handshake, exactly as vLLM's proxies build
// them (docs/vllm-protocol.md): a prefill copy that computes one token and
// exports its KV blocks, and a decode copy that imports them. Bodies are
// edited in place (core/json_body.hpp), never re-serialized.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "core/json_body.hpp"
#include "core/result.hpp"

namespace pdgate {

// What the prefill asks for when the conversation has nothing cached: "send
// my blocks to a decode", with every remote field unknown.
inline constexpr std::string_view kDefaultPrefillKvParams =
    R"({"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,)"
    R"("remote_block_ids":null,"remote_host":null,"remote_port":null})";

// Top-level facts the gateway needs, read once from the indexed body.
struct RequestFacts {
  std::string model;  // empty when the client sent none
  bool stream = false;
  bool is_chat = false;
  // The client's conversation key for multi-turn KV reuse. A number is
  // accepted too and kept as its JSON text, since the Python proxy uses
  // whatever value it gets as a dictionary key.
  std::optional<std::string> conversation_id;
  bool include_usage = false;  // stream_options.include_usage
  // Size of the raw `messages` (chat) or `prompt` (completions) value: a
  // cheap proxy for prompt length when routing.
  std::size_t prompt_bytes = 0;
};

// Fails with a client-facing message when a field the gateway relies on has
// the wrong type (model not a string, stream not a boolean, stream_options
// not an object, conversation_id neither string nor number).
Result<RequestFacts> read_facts(std::string_view body, const JsonObjectIndex& index, bool is_chat);

// Prefill body: the client's body with stream:false, max_tokens:1,
// max_completion_tokens:1 (only if present), min_tokens, stream_options and
// conversation_id removed, and kv_transfer_params replaced by
// `kv_params_raw` (raw JSON text).
std::string make_prefill_body(std::string_view body, const JsonObjectIndex& index,
                              std::string_view kv_params_raw = kDefaultPrefillKvParams);

// Decode body: the client's own body with conversation_id and any
// client-sent kv_transfer_params removed, and kv_transfer_params set to the
// prefill's raw params when given and not `null`.
std::string make_decode_body(std::string_view body, const JsonObjectIndex& index,
                             std::optional<std::string_view> kv_params_raw);

// One-hop body (combined P+D or connector none): the client's body with
// conversation_id and client-sent kv_transfer_params removed.
std::string make_passthrough_body(std::string_view body, const JsonObjectIndex& index);

// The same three bodies as slices of the client's `body` plus the edited
// fragments (core/json_body.hpp), for sending without copying the prompt.
// `body` must outlive the result. Concatenated, each is byte for byte what
// the make_* function above returns.
SplicedText splice_prefill_body(std::string_view body, const JsonObjectIndex& index,
                                std::string_view kv_params_raw = kDefaultPrefillKvParams);
SplicedText splice_decode_body(std::string_view body, const JsonObjectIndex& index,
                               std::optional<std::string_view> kv_params_raw);
SplicedText splice_passthrough_body(std::string_view body, const JsonObjectIndex& index);
// A prefill body for connectors that pass no params (LMCache, P2P NCCL):
// as the prefill body, with any client-sent kv_transfer_params removed.
SplicedText splice_one_token_body(std::string_view body, const JsonObjectIndex& index);

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

// `json_text` without its top-level member `key`; nullopt when the text has
// no such member or is not a valid JSON object (then there is nothing to
// strip and the caller forwards the text unchanged).
std::optional<std::string> strip_member(std::string_view json_text, std::string_view key);

}  // namespace pdgate
