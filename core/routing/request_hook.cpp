#include "core/routing/request_hook.hpp"

#include "core/base/http_tokens.hpp"
#include "core/base/json_edit.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace pdgate {

const char* to_string(RoutePath p) {
  switch (p) {
    case RoutePath::configured:
      return "configured";
    case RoutePath::pd:
      return "pd";
    case RoutePath::one_hop:
      return "one_hop";
  }
  return "?";
}

namespace {

// Hop-by-hop headers (RFC 9110 7.6.1), framing, and what pdgate writes
// itself on every engine request (core/pipeline/engine_call.cpp's upstream_fields).
constexpr std::string_view kRefused[] = {
    "connection",     "keep-alive",          "proxy-connection", "te",
    "trailer",        "transfer-encoding",   "upgrade",          "host",
    "content-length", "content-type",        "expect",           "x-request-id",
    "authorization",  "proxy-authorization", "cookie",           "via",
    "traceparent",    "tracestate",          "baggage",          "x-forwarded-for",
    "forwarded",      "user-agent",
};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::optional<std::int64_t> integer_member(std::string_view body, const JsonObjectIndex& index,
                                           std::string_view key) {
  const auto raw = raw_member(body, index, key);
  if (!raw)
    return std::nullopt;
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(raw->data(), raw->data() + raw->size(), v);
  if (ec != std::errc{} || end != raw->data() + raw->size())
    return std::nullopt;
  return v;
}

}  // namespace

std::optional<std::string> header_edit_error(std::string_view name, const std::string* value) {
  if (name.empty() || name.size() > kMaxHeaderNameBytes)
    return "header name must be 1.." + std::to_string(kMaxHeaderNameBytes) + " bytes";
  if (!http_tokens::is_token(name))
    return "header name '" + std::string(name) + "' is not an HTTP token";
  for (std::string_view r : kRefused) {
    if (iequals(name, r))
      return "header '" + std::string(name) + "' is hop-by-hop or pdgate's own";
  }
  if (name.size() >= 9 && iequals(name.substr(0, 9), "x-pdgate-"))
    return "header '" + std::string(name) + "' is pdgate's own";
  if (value != nullptr) {
    if (value->size() > kMaxHeaderValueBytes)
      return "header value longer than " + std::to_string(kMaxHeaderValueBytes) + " bytes";
    for (char c : *value) {
      const auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\t') || u == 0x7f)
        return "header value contains a control character";
    }
  }
  return std::nullopt;
}

std::optional<std::string> refusal_header_error(std::string_view name, std::string_view value) {
  if (name.empty() || name.size() > kMaxHeaderNameBytes)
    return "header name must be 1.." + std::to_string(kMaxHeaderNameBytes) + " bytes";
  if (!http_tokens::is_token(name))
    return "header name '" + std::string(name) + "' is not an HTTP token";
  const bool x = name.size() > 2 && iequals(name.substr(0, 2), "x-");
  if (!iequals(name, "retry-after") && !x)
    return "a refusal may set Retry-After and x-* headers, not '" + std::string(name) + "'";
  if (iequals(name, "x-request-id") ||
      (name.size() >= 9 && iequals(name.substr(0, 9), "x-pdgate-")))
    return "header '" + std::string(name) + "' is pdgate's own";
  if (value.size() > kMaxRefusalValueBytes)
    return "header value longer than " + std::to_string(kMaxRefusalValueBytes) + " bytes";
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7f)
      return "header value contains a control character";
  }
  return std::nullopt;
}

std::optional<std::string> hooked_body(std::string_view body, const JsonObjectIndex& index,
                                       GenerationApi api, const RequestDecision& d) {
  const bool is_chat = api == GenerationApi::chat;
  // A Responses request reads max_output_tokens alone: a max_tokens
  // there would be ignored by vLLM, and the cap with it.
  const bool responses = api == GenerationApi::responses;
  if (!d.max_tokens_cap && !d.priority)
    return std::nullopt;
  JsonBodyEditor editor(body, index);
  bool changed = false;
  if (d.max_tokens_cap) {
    const std::int64_t cap = *d.max_tokens_cap;
    bool any = false;
    for (std::string_view key :
         {std::string_view("max_tokens"), std::string_view("max_completion_tokens"),
          std::string_view("max_output_tokens")}) {
      if ((key == "max_completion_tokens" && !is_chat) || (key == "max_output_tokens") != responses)
        continue;
      const auto raw = raw_member(body, index, key);
      if (!raw || *raw == "null")
        continue;
      any = true;
      // The validate phase refused what integral_value cannot read; were
      // one to get here, it is capped all the same.
      const auto v = integral_value(*raw);
      if (!v || *v > cap) {
        editor.set(key, std::to_string(cap));
        changed = true;
      }
    }
    // No limit given means the engine's default (up to the context
    // length): the cap becomes the limit.
    if (!any) {
      editor.set(responses ? "max_output_tokens" : "max_tokens", std::to_string(cap));
      changed = true;
    }
  }
  if (d.priority && integer_member(body, index, "priority") != d.priority) {
    editor.set("priority", std::to_string(*d.priority));
    changed = true;
  }
  if (!changed)
    return std::nullopt;
  return editor.render();
}

std::size_t estimated_prompt_tokens(std::size_t prompt_bytes) {
  return (prompt_bytes + 3) / 4;
}

}  // namespace pdgate
