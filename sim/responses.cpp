#include "sim/responses.hpp"

#include "sim/tokenizer.hpp"

namespace pdgate::sim {

namespace {

ojson usage_json(const Usage& u, bool with_details) {
  ojson j;
  j["prompt_tokens"] = u.prompt_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  j["completion_tokens"] = u.completion_tokens;
  // The final streaming usage chunk is dumped with exclude_none in vLLM, so
  // the null details only appear in non-streaming bodies.
  if (u.cached_tokens > 0) {
    ojson details;
    details["cached_tokens"] = u.cached_tokens;
    j["prompt_tokens_details"] = std::move(details);
  } else if (with_details) {
    j["prompt_tokens_details"] = nullptr;
  }
  return j;
}

ojson head(const ResponseMeta& m, bool chunk) {
  ojson j;
  j["id"] = m.id;
  j["object"] = m.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  j["created"] = m.created;
  j["model"] = m.model;
  return j;
}

ojson nullable(std::string_view s) {
  return s.empty() ? ojson(nullptr) : ojson(std::string(s));
}

}  // namespace

ojson make_prompt_logprobs(std::string_view prompt_text) {
  ojson out = ojson::array();
  const std::vector<std::uint32_t> ids = token_ids(prompt_text);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i == 0) {
      out.push_back(nullptr);
      continue;
    }
    const std::string_view bytes = prompt_text.substr(4 * i, 4);
    ojson entry;
    entry["logprob"] = -static_cast<double>(ids[i] % 1000) / 100.0;
    entry["rank"] = 1;
    entry["decoded_token"] = std::string(bytes);
    out.push_back(ojson{{std::to_string(ids[i]), std::move(entry)}});
  }
  return out;
}

ojson make_response(const ResponseMeta& m, std::string_view text, std::string_view finish_reason,
                    const Usage& u, const ojson& kv_params) {
  ojson j = head(m, false);
  ojson choice;
  choice["index"] = 0;
  if (m.chat) {
    ojson msg;
    msg["role"] = "assistant";
    msg["reasoning_content"] = nullptr;
    msg["content"] = std::string(text);
    msg["tool_calls"] = ojson::array();
    choice["message"] = std::move(msg);
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullable(finish_reason);
    choice["stop_reason"] = nullptr;
  } else {
    choice["text"] = std::string(text);
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullable(finish_reason);
    choice["stop_reason"] = nullptr;
    choice["prompt_logprobs"] = nullptr;
  }
  j["choices"] = ojson::array({std::move(choice)});
  j["usage"] = usage_json(u, true);
  if (m.chat)
    j["prompt_logprobs"] = nullptr;
  j["kv_transfer_params"] = kv_params;
  return j;
}

ojson make_role_chunk(const ResponseMeta& m) {
  ojson j = head(m, true);
  ojson choice;
  choice["index"] = 0;
  choice["delta"] = ojson{{"role", "assistant"}, {"content", ""}};
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullptr;
  j["choices"] = ojson::array({std::move(choice)});
  return j;
}

ojson make_token_chunk(const ResponseMeta& m, std::string_view text,
                       std::string_view finish_reason) {
  ojson j = head(m, true);
  ojson choice;
  choice["index"] = 0;
  if (m.chat) {
    choice["delta"] = ojson{{"content", std::string(text)}};
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullable(finish_reason);
    // vLLM dumps chat chunks with exclude_unset: stop_reason only appears
    // once the choice finishes.
    if (!finish_reason.empty())
      choice["stop_reason"] = nullptr;
  } else {
    choice["text"] = std::string(text);
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullable(finish_reason);
    choice["stop_reason"] = nullptr;
  }
  j["choices"] = ojson::array({std::move(choice)});
  if (!m.chat)
    j["usage"] = nullptr;
  return j;
}

ojson make_usage_chunk(const ResponseMeta& m, const Usage& u) {
  ojson j = head(m, true);
  j["choices"] = ojson::array();
  j["usage"] = usage_json(u, false);
  return j;
}

std::string sse_event(const ojson& j) {
  return "data: " + j.dump() + "\n\n";
}

const char* error_type_for(int code) {
  switch (code) {
    case 400:
      return "BadRequestError";
    case 401:
      return "AuthenticationError";
    case 403:
      return "PermissionDeniedError";
    case 404:
      return "NotFoundError";
    case 409:
      return "ConflictError";
    case 413:
      return "RequestEntityTooLargeError";
    case 422:
      return "UnprocessableEntityError";
    case 429:
      return "RateLimitError";
    case 500:
      return "InternalServerError";
    case 501:
      return "NotImplementedError";
    case 503:
      return "ServiceUnavailableError";
    default:
      return code >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

ojson make_error(std::string_view message, int code) {
  ojson e;
  e["message"] = std::string(message);
  e["type"] = error_type_for(code);
  e["param"] = nullptr;
  e["code"] = code;
  ojson j;
  j["error"] = std::move(e);
  return j;
}

ojson make_models(const std::string& model, std::size_t max_model_len, std::int64_t created,
                  const std::string& permission_id) {
  ojson perm;
  perm["id"] = permission_id;
  perm["object"] = "model_permission";
  perm["created"] = created;
  perm["allow_create_engine"] = false;
  perm["allow_sampling"] = true;
  perm["allow_logprobs"] = true;
  perm["allow_search_indices"] = false;
  perm["allow_view"] = true;
  perm["allow_fine_tuning"] = false;
  perm["organization"] = "*";
  perm["group"] = nullptr;
  perm["is_blocking"] = false;
  ojson card;
  card["id"] = model;
  card["object"] = "model";
  card["created"] = created;
  card["owned_by"] = "vllm";
  card["root"] = model;
  card["parent"] = nullptr;
  card["max_model_len"] = max_model_len;
  card["permission"] = ojson::array({std::move(perm)});
  ojson j;
  j["object"] = "list";
  j["data"] = ojson::array({std::move(card)});
  return j;
}

ojson make_kv_params(const std::vector<std::int64_t>& block_ids, const std::string& engine_id,
                     const std::string& remote_request_id, const std::string& host,
                     std::uint16_t port, std::string_view transfer_mode) {
  ojson j;
  j["do_remote_prefill"] = true;
  j["do_remote_decode"] = false;
  j["remote_block_ids"] = ojson::array({ojson(block_ids)});
  j["remote_engine_id"] = engine_id;
  j["remote_request_id"] = remote_request_id;
  j["remote_host"] = host;
  j["remote_port"] = port;
  j["tp_size"] = 1;
  // What vLLM's scheduler answers besides: no expiry for a prefill's own
  // blocks (only a decode's, for the next turn), and the transfer mode.
  j["remote_blocks_expiry_time"] = nullptr;
  j["transfer_mode"] = transfer_mode;
  return j;
}

}  // namespace pdgate::sim
