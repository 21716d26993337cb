// Reading and checking a generation request (generation_request.hpp).
// Synchronous on purpose: error messages are built here, never inside a
// co_await expression (GCC 12 mis-destroys conditional temporaries there).
#include "sim/generation_request.hpp"

#include "sim/responses_api.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <regex>
#include <string_view>
#include <utility>

namespace pdgate::sim {

namespace {

using nlohmann::json;

// What --kv-connector forbids: params with any connector but NIXL (the
// others move the cache out of band), and with p2p-nccl a prefill or
// decode request id that does not name both peers.
std::string connector_violation(const SimOptions& opts, const json& body, const std::string& rid) {
  if (opts.kv_connector == "nixl" || opts.kv_connector == "mooncake" ||
      opts.role == SimRole::encode)
    return {};
  if (body.contains("kv_transfer_params") && !body["kv_transfer_params"].is_null()) {
    return "kv_transfer_params are not used with the " + opts.kv_connector + " connector";
  }
  static const std::regex kP2pId(
      "___prefill_addr_[^_]+:[0-9]+___decode_addr_[^_]+:[0-9]+_[0-9a-f]{32}");
  if (opts.kv_connector == "p2p-nccl" && opts.role != SimRole::both &&
      !std::regex_match(rid, kP2pId)) {
    return "p2p-nccl request id must be ___prefill_addr_{host:port}___decode_addr_{host:port}_"
           "{32 hex}, got '" +
           rid + "'";
  }
  return {};
}

// A continuation's starting token. Chat: vLLM's continue_final_message
// (ChatCompletionRequest.check_generation_prompt refuses it together with
// an explicit add_generation_prompt: true, and the chat template refuses
// it with the default true), continuing the final assistant message.
// Completions: the prompt itself, extended by the answer so far.
std::optional<HttpError> read_continuation(const json& body, SimApi api, GenRequest& g) {
  if (api == SimApi::completions) {
    // A token-id prompt (a gateway resuming token-exact) ends with the
    // answer's ids; a text prompt with its words.
    const json& prompt = body.contains("prompt") ? body["prompt"] : json();
    const bool ids = prompt.is_array() && !prompt.empty() && prompt.front().is_number_integer();
    g.first_token =
        ids ? continuation_offset(token_ids(g.prompt.text)) : continuation_offset(g.prompt.text);
    return std::nullopt;
  }
  if (api != SimApi::chat)
    return std::nullopt;
  auto flag = [&](const char* k) -> std::optional<bool> {
    const auto it = body.find(k);
    if (it == body.end() || it->is_null())
      return std::nullopt;
    if (!it->is_boolean())
      return false;
    return it->get<bool>();
  };
  if (!flag("continue_final_message").value_or(false))
    return std::nullopt;
  if (flag("add_generation_prompt").value_or(true))
    return HttpError{400,
                     "Cannot set both `continue_final_message` and `add_generation_prompt` to "
                     "True."};
  const json& last = body["messages"].back();
  if (last.value("role", json()) == "assistant" && last.contains("content") &&
      last["content"].is_string())
    g.first_token = continuation_offset(last["content"].get<std::string>());
  return std::nullopt;
}

}  // namespace

std::optional<HttpError> check_model(const json& body, const std::string& model) {
  if (!body.contains("model") || body["model"].is_null())
    return std::nullopt;
  const json& m = body["model"];
  if (m.is_string() && m.get<std::string>() == model)
    return std::nullopt;
  std::string name = m.is_string() ? m.get<std::string>() : m.dump();
  return HttpError{404, "The model `" + name + "` does not exist."};
}

std::optional<HttpError> parse_generation(const Request& req, SimApi api, const SimOptions& opts,
                                          Counters& counters, spdlog::logger& log,
                                          RequestRecord& rec, GenRequest& g) {
  const bool chat = api == SimApi::chat;
  const bool responses = api == SimApi::responses;
  if (auto it = req.find("x-sim-fault"); it != req.end()) {
    FaultParse fp = parse_fault_header(it->value());
    rec.fault = std::string(it->value());
    if (!fp.error.empty())
      return HttpError{400, fp.error};
    g.fault = fp.fault;
  }
  const json body = json::parse(req.body(), nullptr, false);
  if (body.is_discarded())
    return HttpError{400, "Invalid JSON in request body"};
  if (!body.is_object())
    return HttpError{400, "Request body must be a JSON object"};
  // A LoRA adapter served besides the base model is a model of its own.
  if (const auto m = body.find("model");
      m != body.end() && m->is_string() &&
      std::find(opts.lora_modules.begin(), opts.lora_modules.end(), m->get<std::string>()) !=
          opts.lora_modules.end())
    g.lora = m->get<std::string>();
  else if (std::optional<HttpError> e = check_model(body, opts.model))
    return e;
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean())
      return HttpError{400, "'stream' must be a boolean"};
    g.stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    if (!g.stream) {
      return HttpError{400, "Stream options can only be defined when `stream=True`."};
    }
    const json& so = body["stream_options"];
    g.include_usage = so.is_object() && so.contains("include_usage") &&
                      so["include_usage"].is_boolean() && so["include_usage"].get<bool>();
  }
  if (body.contains("return_token_ids") && !body["return_token_ids"].is_null()) {
    if (!body["return_token_ids"].is_boolean())
      return HttpError{400, "'return_token_ids' must be a boolean"};
    g.return_token_ids = body["return_token_ids"].get<bool>();
  }
  if (opts.role == SimRole::encode) {
    if (std::string v = encoder_violation(body, chat); !v.empty()) {
      ++counters.encoder_violations;
      log.warn("request {}: encoder rule broken: {}", rec.request_id, v);
      return HttpError{400, v};
    }
  }
  if (std::string v = connector_violation(opts, body, rec.request_id); !v.empty()) {
    log.warn("request {}: --kv-connector {} rule broken: {}", rec.request_id, opts.kv_connector, v);
    return HttpError{400, v};
  }
  PromptResult pr = responses ? responses_prompt(body)
                    : chat    ? chat_prompt(body)
                              : completion_prompt(body);
  if (!pr.ok())
    return HttpError{400, pr.error};
  g.prompt = std::move(pr.prompt);
  if (std::optional<HttpError> e = read_continuation(body, api, g))
    return e;
  const std::size_t prompt_tokens = g.prompt.tokens;
  rec.prompt_tokens = prompt_tokens;

  g.max_tokens = opts.default_max_tokens;
  // A ResponsesRequest reads max_output_tokens alone (and ignores
  // max_tokens, as vLLM does).
  for (const char* key : {"max_completion_tokens", "max_tokens", "max_output_tokens"}) {
    if (!chat && std::string_view(key) == "max_completion_tokens")
      continue;
    if (responses != (std::string_view(key) == "max_output_tokens"))
      continue;
    if (!body.contains(key) || body[key].is_null())
      continue;
    if (!body[key].is_number_integer() || body[key].get<std::int64_t>() < 1) {
      return HttpError{400, std::string("'") + key + "' must be an integer >= 1"};
    }
    g.max_tokens = body[key].get<std::size_t>();
    break;
  }
  if (body.contains("prompt_logprobs") && !body["prompt_logprobs"].is_null()) {
    if (!body["prompt_logprobs"].is_number_integer() ||
        body["prompt_logprobs"].get<std::int64_t>() < -1)
      return HttpError{400, "'prompt_logprobs' must be an integer >= -1"};
    g.prompt_logprobs = body["prompt_logprobs"].get<std::int64_t>();
  }
  const std::string limit = std::to_string(opts.max_model_len);
  if (prompt_tokens > opts.max_model_len) {
    return HttpError{400, "This model's maximum context length is " + limit +
                              " tokens. However, your request has " +
                              std::to_string(prompt_tokens) +
                              " input tokens. Please reduce the length of the input messages."};
  }
  if (prompt_tokens + g.max_tokens > opts.max_model_len) {
    const std::string mt = std::to_string(g.max_tokens);
    const std::string pt = std::to_string(prompt_tokens);
    return HttpError{400, "'max_tokens' or 'max_completion_tokens' is too large: " + mt +
                              ". This model's maximum context length is " + limit +
                              " tokens and your request has " + pt + " input tokens (" + mt +
                              " > " + limit + " - " + pt + ")."};
  }

  g.body = body;
  // The request's side of the handshake, from its kv_transfer_params.
  if (body.contains("kv_transfer_params") && body["kv_transfer_params"].is_object() &&
      opts.role != SimRole::encode) {
    g.kv = body["kv_transfer_params"];
    auto flag = [&](const char* k) {
      return g.kv.contains(k) && g.kv[k].is_boolean() && g.kv[k].get<bool>();
    };
    g.remote_prefill = flag("do_remote_prefill");
    if (opts.kv_connector == "mooncake") {
      // vLLM's MooncakeConnector (update_state_after_alloc): a decode leg
      // needs remote_engine_id, remote_bootstrap_addr and transfer_id, or
      // computes the prompt itself; a prefill leg without a transfer_id
      // sends nothing.
      auto text = [&](const char* k) {
        return g.kv.contains(k) && g.kv[k].is_string() ? g.kv[k].get<std::string>() : std::string();
      };
      g.transfer_id = text("transfer_id");
      const bool complete = !g.transfer_id.empty() && !text("remote_engine_id").empty() &&
                            text("remote_bootstrap_addr").rfind("http://", 0) == 0;
      if (g.remote_prefill && !complete) {
        log.warn("request {}: invalid Mooncake kv_transfer_params; computing the prompt here",
                 rec.request_id);
        g.remote_prefill = false;
      }
      g.remote_decode = !g.remote_prefill && flag("do_remote_decode") && !g.transfer_id.empty();
      return std::nullopt;
    }
    if (g.remote_prefill && opts.kv_transfer_mode == "push") {
      // vLLM's push decode reads these as params[key] when it registers
      // with prefill: a missing one fails the request (a KeyError there).
      for (const char* k : {"remote_engine_id", "remote_request_id", "remote_host"}) {
        if (!g.kv.contains(k) || !g.kv[k].is_string())
          return HttpError{500, std::string("NIXL push kv_transfer_params: '") + k +
                                    "' is missing or not a string"};
      }
      for (const char* k : {"remote_port", "tp_size"}) {
        if (!g.kv.contains(k) || !g.kv[k].is_number_unsigned())
          return HttpError{500, std::string("NIXL push kv_transfer_params: '") + k +
                                    "' is missing or not an integer"};
      }
    }
    g.remote_decode = !g.remote_prefill && flag("do_remote_decode");
    if (g.remote_decode) {
      for (const char* k :
           {"remote_engine_id", "remote_request_id", "remote_host", "remote_port"}) {
        if (g.kv.contains(k) && !g.kv[k].is_null())
          g.names_remote = true;
      }
    }
  }
  return std::nullopt;
}

}  // namespace pdgate::sim
