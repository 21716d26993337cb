#include "plugins/kv_bodies.hpp"
#include "core/base/json_edit.hpp"

namespace pdgate {
namespace {

bool is_null(std::string_view raw) {
  return raw == "null";
}

std::string_view trim_ws(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && ws(s.front()))
    s.remove_prefix(1);
  while (!s.empty() && ws(s.back()))
    s.remove_suffix(1);
  return s;
}

// The prefill computes the prompt's KV cache and stops after one token.
// `kv_params_raw`: what to ask of it, or nullopt to drop the client's.
JsonBodyEditor prefill_edits(std::string_view body, const JsonObjectIndex& index,
                             std::optional<std::string_view> kv_params_raw, OneTokenFields fields) {
  JsonBodyEditor e(body, index);
  e.set("stream", "false");
  e.set(fields.always, "1");
  if (!fields.if_present.empty() && raw_member(body, index, fields.if_present))
    e.set(fields.if_present, "1");
  // A lower bound above one token would contradict the limit (vLLM's
  // proxies drop both; decode gets them back with the client's body).
  e.remove("min_tokens");
  e.remove("min_completion_tokens");
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
                              std::string_view kv_params_raw, OneTokenFields fields) {
  return prefill_edits(body, index, kv_params_raw, fields).render();
}

std::string make_decode_body(std::string_view body, const JsonObjectIndex& index,
                             std::optional<std::string_view> kv_params_raw) {
  return decode_edits(body, index, kv_params_raw).render();
}

std::string make_passthrough_body(std::string_view body, const JsonObjectIndex& index) {
  return decode_edits(body, index, std::nullopt).render();
}

SplicedText splice_prefill_body(std::string_view body, const JsonObjectIndex& index,
                                std::string_view kv_params_raw, OneTokenFields fields) {
  return prefill_edits(body, index, kv_params_raw, fields).splice();
}

SplicedText splice_decode_body(std::string_view body, const JsonObjectIndex& index,
                               std::optional<std::string_view> kv_params_raw) {
  return decode_edits(body, index, kv_params_raw).splice();
}

SplicedText splice_passthrough_body(std::string_view body, const JsonObjectIndex& index) {
  return decode_edits(body, index, std::nullopt).splice();
}

SplicedText splice_one_token_body(std::string_view body, const JsonObjectIndex& index,
                                  OneTokenFields fields) {
  return prefill_edits(body, index, std::nullopt, fields).splice();
}

}  // namespace pdgate
