#include "core/body_rewrite.hpp"

#include <utility>

namespace pdgate {
namespace {

bool is_null(std::string_view raw) {
  return raw == "null";
}

// The first byte of a validated raw value tells its type.
char kind(std::string_view raw) {
  return raw.empty() ? '\0' : raw.front();
}
bool is_number(std::string_view raw) {
  const char c = kind(raw);
  return c == '-' || (c >= '0' && c <= '9');
}

std::string_view trim_ws(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && ws(s.front()))
    s.remove_prefix(1);
  while (!s.empty() && ws(s.back()))
    s.remove_suffix(1);
  return s;
}

}  // namespace

Result<RequestFacts> read_facts(std::string_view body, const JsonObjectIndex& index, bool is_chat) {
  RequestFacts f;
  f.is_chat = is_chat;

  if (const auto model = raw_member(body, index, "model"); model && !is_null(*model)) {
    auto decoded = kind(*model) == '"' ? decode_json_string(*model) : std::nullopt;
    if (!decoded)
      return fail("'model' must be a string");
    f.model = std::move(*decoded);
  }

  if (const auto stream = raw_member(body, index, "stream"); stream && !is_null(*stream)) {
    const auto b = bool_member(body, index, "stream");
    if (!b)
      return fail("'stream' must be a boolean");
    f.stream = *b;
  }

  if (const auto so = raw_member(body, index, "stream_options"); so && !is_null(*so)) {
    if (kind(*so) != '{')
      return fail("'stream_options' must be an object");
    // stream_options is a small object inside an already validated body,
    // so indexing it again cannot fail and costs next to nothing.
    const auto inner = index_json_object(*so);
    if (!inner)
      return fail("'stream_options': " + inner.error());
    const auto usage = raw_member(*so, *inner, "include_usage");
    if (usage && !is_null(*usage)) {
      const auto b = bool_member(*so, *inner, "include_usage");
      if (!b)
        return fail("'stream_options.include_usage' must be a boolean");
      f.include_usage = *b;
    }
  }

  if (const auto cid = raw_member(body, index, "conversation_id"); cid && !is_null(*cid)) {
    if (kind(*cid) == '"') {
      f.conversation_id = decode_json_string(*cid);
    } else if (is_number(*cid)) {
      f.conversation_id = std::string(*cid);
    } else {
      return fail("'conversation_id' must be a string");
    }
  }

  if (const auto prompt = raw_member(body, index, is_chat ? "messages" : "prompt")) {
    f.prompt_bytes = prompt->size();
  }
  return f;
}

namespace {

// The prefill computes the prompt's KV cache and stops after one token.
// `kv_params_raw`: what to ask of it, or nullopt to drop the client's.
JsonBodyEditor prefill_edits(std::string_view body, const JsonObjectIndex& index,
                             std::optional<std::string_view> kv_params_raw) {
  JsonBodyEditor e(body, index);
  e.set("stream", "false");
  e.set("max_tokens", "1");
  if (raw_member(body, index, "max_completion_tokens"))
    e.set("max_completion_tokens", "1");
  e.remove("min_tokens");
  // vLLM rejects stream_options when stream is false.
  e.remove("stream_options");
  e.remove("conversation_id");
  if (kv_params_raw) {
    e.set("kv_transfer_params", std::string(*kv_params_raw));
  } else {
    e.remove("kv_transfer_params");
  }
  return e;
}

JsonBodyEditor decode_edits(std::string_view body, const JsonObjectIndex& index,
                            std::optional<std::string_view> kv_params_raw) {
  JsonBodyEditor e(body, index);
  e.remove("conversation_id");
  // Params the client sent itself must never reach decode: they would make
  // it pull blocks the gateway did not arrange for.
  if (kv_params_raw && !is_null(trim_ws(*kv_params_raw))) {
    e.set("kv_transfer_params", std::string(*kv_params_raw));
  } else {
    e.remove("kv_transfer_params");
  }
  return e;
}

}  // namespace

std::string make_prefill_body(std::string_view body, const JsonObjectIndex& index,
                              std::string_view kv_params_raw) {
  return prefill_edits(body, index, kv_params_raw).render();
}

std::string make_decode_body(std::string_view body, const JsonObjectIndex& index,
                             std::optional<std::string_view> kv_params_raw) {
  return decode_edits(body, index, kv_params_raw).render();
}

std::string make_passthrough_body(std::string_view body, const JsonObjectIndex& index) {
  return decode_edits(body, index, std::nullopt).render();
}

SplicedText splice_prefill_body(std::string_view body, const JsonObjectIndex& index,
                                std::string_view kv_params_raw) {
  return prefill_edits(body, index, kv_params_raw).splice();
}

SplicedText splice_decode_body(std::string_view body, const JsonObjectIndex& index,
                               std::optional<std::string_view> kv_params_raw) {
  return decode_edits(body, index, kv_params_raw).splice();
}

SplicedText splice_passthrough_body(std::string_view body, const JsonObjectIndex& index) {
  return decode_edits(body, index, std::nullopt).splice();
}

SplicedText splice_one_token_body(std::string_view body, const JsonObjectIndex& index) {
  return prefill_edits(body, index, std::nullopt).splice();
}

Result<std::optional<std::string>> extract_kv_params(std::string_view response_body) {
  const auto index = index_json_object(response_body);
  if (!index)
    return fail("prefill response: " + index.error());
  const auto raw = raw_member(response_body, *index, "kv_transfer_params");
  if (!raw || is_null(*raw))
    return std::optional<std::string>();
  if (kind(*raw) != '{')
    return fail("prefill response: kv_transfer_params is not an object");
  return std::optional<std::string>(std::string(*raw));
}

Result<std::string> kv_params_for_next_turn_prefill(std::string_view decode_params_raw,
                                                    std::string_view decode_host) {
  const auto index = index_json_object(decode_params_raw);
  if (!index)
    return fail("decode kv_transfer_params: " + index.error());
  JsonBodyEditor e(decode_params_raw, *index);
  e.set("do_remote_decode", "true");
  e.set("do_remote_prefill", "false");
  e.set("remote_host", json_quote(decode_host));
  return e.render();
}

std::optional<std::string> strip_member(std::string_view json_text, std::string_view key) {
  const auto index = index_json_object(json_text);
  if (!index || !raw_member(json_text, *index, key))
    return std::nullopt;
  JsonBodyEditor e(json_text, *index);
  e.remove(key);
  return e.render();
}

}  // namespace pdgate
