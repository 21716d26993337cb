// What a generation request asks for: its body read and checked against
// vLLM's rules (and the sim's --role and --kv-connector rules) before any
// work starts, so every refusal is a plain error answer.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include <spdlog/fwd.h>
#include <nlohmann/json.hpp>

#include "sim/http_exchange.hpp"
#include "sim/metrics.hpp"
#include "sim/options.hpp"
#include "sim/request_log.hpp"
#include "sim/tokenizer.hpp"

namespace pdgate::sim {

// The API a generation request speaks (its route).
enum class SimApi { completions, chat, responses };

// A generation request after validation: everything the coroutine needs.
struct GenRequest {
  Fault fault;
  bool stream = false;
  bool include_usage = false;
  // vLLM's return_token_ids: the prompt's ids in the first chunk (or the
  // answer), each token's id with it.
  bool return_token_ids = false;
  Prompt prompt;
  std::size_t max_tokens = 0;
  // The output token the answer starts at: non-zero for a continuation
  // (continuation_offset(), sim/tokenizer.hpp).
  std::size_t first_token = 0;
  nlohmann::json body;          // the request's body, parsed
  nlohmann::json kv;            // kv_transfer_params, or null
  bool remote_prefill = false;  // decode side of the handshake: pull, then decode
  bool remote_decode = false;   // prefill side: compute, then issue params
  bool names_remote = false;    // prefill handed a remote's blocks (multi-turn)
  std::string lora;             // the LoRA adapter the request names (--lora-modules), or empty
  // vLLM's prompt_logprobs (top-k per prompt token; -1: the whole
  // vocabulary, here one entry as for 0): logprobs of the prompt, which
  // only an engine that computed the prompt can give.
  std::optional<std::int64_t> prompt_logprobs;
  // Mooncake: the gateway's transfer id both legs carry; a decode leg
  // waits for prefill's KV under it.
  std::string transfer_id;
};

struct HttpError {
  int code = 400;
  std::string message;
};

// vLLM answers 404 for a model it does not serve; no model means ours.
std::optional<HttpError> check_model(const nlohmann::json& body, const std::string& model);

// Fills `g` from a POST to /v1/completions, /v1/chat/completions or
// /v1/responses (`api`) and notes the fault header and prompt size in
// `rec`; returns the error to answer instead when the request is refused.
std::optional<HttpError> parse_generation(const Request& req, SimApi api, const SimOptions& opts,
                                          Counters& counters, spdlog::logger& log,
                                          RequestRecord& rec, GenRequest& g);

}  // namespace pdgate::sim
