#include "sim/responses_api.hpp"

#include <utility>

namespace pdgate::sim {

namespace {

using nlohmann::json;

// An input item's content part as the chat prompt rules read it.
json chat_part(const json& part) {
  if (!part.is_object())
    return json{{"type", "text"}, {"text", part.dump()}};
  const std::string type = part.value("type", "");
  if ((type == "input_text" || type == "output_text") && part.contains("text"))
    return json{{"type", "text"}, {"text", part["text"]}};
  if (type == "input_image" && part.contains("image_url"))
    return json{{"type", "image_url"}, {"image_url", {{"url", part["image_url"]}}}};
  return json{{"type", "text"}, {"text", part.dump()}};
}

json chat_message(const json& item) {
  if (item.is_object() && item.contains("role") && item.contains("content")) {
    json msg{{"role", item["role"]}};
    const json& content = item["content"];
    if (content.is_array()) {
      json parts = json::array();
      for (const json& p : content)
        parts.push_back(chat_part(p));
      msg["content"] = std::move(parts);
    } else {
      msg["content"] = content;
    }
    return msg;
  }
  // A function call, its output, a reasoning item...: its text counts.
  return json{{"role", "user"}, {"content", item.dump()}};
}

ojson usage_json(const Usage& u, std::size_t cached) {
  ojson j;
  j["input_tokens"] = u.prompt_tokens;
  j["input_tokens_details"] = {{"cached_tokens", cached},
                               {"input_tokens_per_turn", ojson::array()},
                               {"cached_tokens_per_turn", ojson::array()}};
  j["output_tokens"] = u.completion_tokens;
  j["output_tokens_details"] = {{"reasoning_tokens", 0},
                                {"tool_output_tokens", 0},
                                {"output_tokens_per_turn", ojson::array()},
                                {"tool_output_tokens_per_turn", ojson::array()}};
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  return j;
}

ojson text_part(std::string_view text) {
  ojson p;
  p["annotations"] = ojson::array();
  p["text"] = std::string(text);
  p["type"] = "output_text";
  p["logprobs"] = ojson::array();
  return p;
}

ojson field_or(const json& request, const char* key, ojson fallback) {
  if (request.is_object() && request.contains(key) && !request[key].is_null())
    return ojson::parse(request[key].dump());
  return fallback;
}

}  // namespace

PromptResult responses_prompt(const json& body) {
  json messages = json::array();
  if (body.contains("instructions") && body["instructions"].is_string())
    messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
  if (!body.contains("input"))
    return PromptResult{{}, "Field required: input"};
  const json& input = body["input"];
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
  } else if (input.is_array()) {
    for (const json& item : input)
      messages.push_back(chat_message(item));
  } else {
    return PromptResult{{}, "'input' must be a string or a list of input items"};
  }
  return chat_prompt(json{{"messages", std::move(messages)}});
}

ResponsesAnswer::ResponsesAnswer(const std::string& rid, std::string model, std::int64_t created,
                                 const json& request, std::size_t max_output_tokens)
    : id_("resp_" + rid),
      item_id_("msg_" + rid),
      model_(std::move(model)),
      created_(created),
      max_output_tokens_(max_output_tokens) {
  echo_["instructions"] = field_or(request, "instructions", nullptr);
  echo_["metadata"] = field_or(request, "metadata", nullptr);
  echo_["parallel_tool_calls"] = field_or(request, "parallel_tool_calls", true);
  echo_["temperature"] = field_or(request, "temperature", 1.0);
  echo_["tool_choice"] = field_or(request, "tool_choice", "auto");
  echo_["tools"] = field_or(request, "tools", ojson::array());
  echo_["top_p"] = field_or(request, "top_p", 1.0);
  echo_["background"] = field_or(request, "background", false);
  echo_["previous_response_id"] = field_or(request, "previous_response_id", nullptr);
  echo_["service_tier"] = field_or(request, "service_tier", "auto");
  echo_["truncation"] = field_or(request, "truncation", "disabled");
  echo_["user"] = field_or(request, "user", nullptr);
}

ojson ResponsesAnswer::response(std::string_view status, const ojson& output, const ojson& usage,
                                const ojson& kv_params) const {
  // ResponsesResponse's field order.
  ojson j;
  j["id"] = id_;
  j["created_at"] = created_;
  j["incomplete_details"] = nullptr;
  j["instructions"] = echo_["instructions"];
  j["metadata"] = echo_["metadata"];
  j["model"] = model_;
  j["object"] = "response";
  j["output"] = output;
  j["parallel_tool_calls"] = echo_["parallel_tool_calls"];
  j["temperature"] = echo_["temperature"];
  j["tool_choice"] = echo_["tool_choice"];
  j["tools"] = echo_["tools"];
  j["top_p"] = echo_["top_p"];
  j["background"] = echo_["background"];
  j["max_output_tokens"] = max_output_tokens_;
  j["max_tool_calls"] = nullptr;
  j["previous_response_id"] = echo_["previous_response_id"];
  j["prompt"] = nullptr;
  j["reasoning"] = nullptr;
  j["service_tier"] = echo_["service_tier"];
  j["status"] = std::string(status);
  j["text"] = nullptr;
  j["top_logprobs"] = nullptr;
  j["truncation"] = echo_["truncation"];
  j["usage"] = usage;
  j["user"] = echo_["user"];
  j["input_messages"] = nullptr;
  j["output_messages"] = nullptr;
  j["kv_transfer_params"] = kv_params;
  return j;
}

ojson ResponsesAnswer::message(std::string_view status, std::string_view text) const {
  ojson m;
  m["id"] = item_id_;
  m["content"] = status == "in_progress" ? ojson::array() : ojson::array({text_part(text)});
  m["role"] = "assistant";
  m["status"] = std::string(status);
  m["type"] = "message";
  return m;
}

std::string ResponsesAnswer::event(ojson j) {
  const std::string type = j["type"].get<std::string>();
  j["sequence_number"] = sequence_++;
  return sse_named_event(type, j);
}

std::string ResponsesAnswer::start_events() {
  const ojson in_progress = response("in_progress", ojson::array(), nullptr, nullptr);
  std::string out;
  out += event({{"response", in_progress}, {"type", "response.created"}});
  out += event({{"response", in_progress}, {"type", "response.in_progress"}});
  out += event({{"item", message("in_progress", "")},
                {"output_index", 0},
                {"type", "response.output_item.added"}});
  ojson part = text_part("");
  out += event({{"content_index", 0},
                {"item_id", item_id_},
                {"output_index", 0},
                {"part", part},
                {"type", "response.content_part.added"}});
  return out;
}

std::string ResponsesAnswer::delta_event(std::string_view text) {
  return event({{"content_index", 0},
                {"delta", std::string(text)},
                {"item_id", item_id_},
                {"logprobs", ojson::array()},
                {"output_index", 0},
                {"type", "response.output_text.delta"}});
}

std::string ResponsesAnswer::finish_events(std::string_view text, const Usage& u,
                                           std::size_t cached, const ojson& kv_params) {
  std::string out;
  out += event({{"content_index", 0},
                {"item_id", item_id_},
                {"logprobs", ojson::array()},
                {"output_index", 0},
                {"text", std::string(text)},
                {"type", "response.output_text.done"}});
  out += event({{"content_index", 0},
                {"item_id", item_id_},
                {"output_index", 0},
                {"part", text_part(text)},
                {"type", "response.content_part.done"}});
  out += event({{"item", message("completed", text)},
                {"output_index", 0},
                {"type", "response.output_item.done"}});
  out += event({{"response", whole(text, u, cached, kv_params)}, {"type", "response.completed"}});
  return out;
}

ojson ResponsesAnswer::whole(std::string_view text, const Usage& u, std::size_t cached,
                             const ojson& kv_params) {
  // Ended by its token limit, as every sim answer is: vLLM says
  // "incomplete" (max_output_tokens) only when the limit was the client's.
  return response("completed", ojson::array({message("completed", text)}), usage_json(u, cached),
                  kv_params);
}

std::string sse_named_event(std::string_view type, const ojson& j) {
  std::string out = "event: ";
  out += type;
  out += "\ndata: ";
  out += j.dump();
  out += "\n\n";
  return out;
}

}  // namespace pdgate::sim
