#include "core/pipeline/engine_call.hpp"

#include <charconv>

#include "core/base/json_edit.hpp"
#include "core/net/http_head.hpp"
#include "core/pipeline/forwarded_headers.hpp"

namespace pdgate {

namespace {

// The fields every upstream request carries, in the order Beast would
// write them.
template <class Sink>
void upstream_fields(Sink&& add, const Instance& inst, const std::string& request_id,
                     const ForwardedHeaders& fwd, std::string_view traceparent) {
  add("Host", inst.host_port);
  add("User-Agent", "pdgate");
  add("X-Request-Id", request_id);
  // A data-parallel rank is an instance of its own: every leg sent to it
  // names it (vLLM's API server hands the request to that engine core).
  if (inst.dp_rank_header[0] != '\0')
    add("X-data-parallel-rank", std::string_view(inst.dp_rank_header));
  if (!fwd.authorization.empty())
    add("Authorization", fwd.authorization);
  if (!fwd.via.empty())
    add("Via", fwd.via);
  if (traceparent.empty())
    traceparent = fwd.traceparent;
  if (!traceparent.empty())
    add("traceparent", traceparent);
  if (!fwd.tracestate.empty())
    add("tracestate", fwd.tracestate);
  if (!fwd.baggage.empty())
    add("baggage", fwd.baggage);
  if (!fwd.x_forwarded_for.empty())
    add("X-Forwarded-For", fwd.x_forwarded_for);
  if (!fwd.forwarded.empty())
    add("Forwarded", fwd.forwarded);
  for (const auto& [name, value] : fwd.extra)
    add(name, value);
  for (const auto& [name, value] : fwd.policy_set)
    add(name, value);
}

}  // namespace

std::string upstream_head(http::verb method, const Instance& inst, std::string_view target,
                          std::size_t body_size, const std::string& request_id,
                          const ForwardedHeaders& fwd, std::string_view traceparent,
                          std::string_view content_type) {
  const bool post = method == http::verb::post;
  if (content_type.empty())
    content_type = "application/json";
  char digits[24];
  const std::string_view length(
      digits, post ? static_cast<std::size_t>(
                         std::to_chars(digits, digits + sizeof digits, body_size).ptr - digits)
                   : 0);
  return assemble_head([&](auto&& put) {
    put(http::to_string(method));
    put(" ");
    put(target);
    put(" HTTP/1.1\r\n");
    upstream_fields(
        [&put](std::string_view name, std::string_view value) {
          put(name);
          put(": ");
          put(value);
          put("\r\n");
        },
        inst, request_id, fwd, traceparent);
    if (post) {
      put("Content-Type: ");
      put(content_type);
      put("\r\nContent-Length: ");
      put(length);
      put("\r\n");
    }
    put("\r\n");
  });
}

http::request<http::string_body> upstream_request(http::verb method, const Instance& inst,
                                                  std::string_view target, std::string body,
                                                  const std::string& request_id,
                                                  const ForwardedHeaders& fwd,
                                                  std::string_view traceparent) {
  http::request<http::string_body> r{method, target, 11};
  upstream_fields([&r](std::string_view name, std::string_view value) { r.insert(name, value); },
                  inst, request_id, fwd, traceparent);
  if (method == http::verb::post)
    r.set(http::field::content_type, "application/json");
  r.keep_alive(true);
  r.body() = std::move(body);
  r.prepare_payload();
  return r;
}

void trace_error(StageSpan& span, const GatewayError& e) {
  span.error(to_string(e.kind), e.message);
}

namespace {

// The raw `usage` object of an engine's JSON answer, found from the end
// (engines write it last) without indexing the whole answer: the answer
// can be long, and this runs on the request path. A quoted "usage"
// followed by ':' can only be a key: inside a JSON string its quotes
// would be escaped.
std::optional<std::string_view> usage_object(std::string_view answer) {
  const std::size_t key = answer.rfind("\"usage\"");
  if (key == std::string_view::npos)
    return std::nullopt;
  std::size_t i = key + 7;
  while (i < answer.size() && (answer[i] == ' ' || answer[i] == '\n' || answer[i] == '\r' ||
                               answer[i] == '\t' || answer[i] == ':'))
    ++i;
  if (i >= answer.size() || answer[i] != '{')
    return std::nullopt;
  // Its members are numbers and objects of numbers (no strings).
  int depth = 0;
  for (std::size_t j = i; j < answer.size(); ++j) {
    if (answer[j] == '{') {
      ++depth;
    } else if (answer[j] == '}' && --depth == 0) {
      return answer.substr(i, j + 1 - i);
    }
  }
  return std::nullopt;
}

}  // namespace

void trace_usage(StageSpan& span, std::string_view answer) {
  if (!span.recording())
    return;
  const auto usage = usage_object(answer);
  if (!usage)
    return;
  const auto counts = index_json_object(*usage);
  if (!counts)
    return;
  const std::pair<std::string_view, const char*> names[] = {
      {"prompt_tokens", "gen_ai.usage.input_tokens"},
      {"completion_tokens", "gen_ai.usage.output_tokens"}};
  for (const auto& [member, attribute] : names) {
    const auto raw = raw_member(*usage, *counts, member);
    std::int64_t n = 0;
    if (raw && std::from_chars(raw->data(), raw->data() + raw->size(), n).ec == std::errc())
      span.attribute(attribute, n);
  }
}

std::vector<net::const_buffer> body_buffers(const SplicedText& body) {
  std::vector<net::const_buffer> out;
  out.reserve(body.piece_count());
  body.for_each([&](std::string_view piece) { out.emplace_back(piece.data(), piece.size()); });
  return out;
}

std::string snippet(std::string_view s, std::size_t max) {
  std::string out(s.substr(0, max));
  if (s.size() > max)
    out += "...";
  return out;
}

}  // namespace pdgate
