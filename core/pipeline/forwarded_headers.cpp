#include "core/pipeline/forwarded_headers.hpp"

#include <spdlog/spdlog.h>

namespace pdgate {

namespace {

// Every value of a header the client may have sent on several lines, as
// one comma-separated list (RFC 9110 5.3).
std::string joined_values(const http::request<http::string_body>& req, std::string_view name) {
  std::string out;
  const auto [first, last] = req.equal_range(name);
  for (auto it = first; it != last; ++it) {
    if (!out.empty())
      out += ", ";
    out += it->value();
  }
  return out;
}

// "a" + ", " + "b", or "b" when there is no "a".
std::string appended(std::string list, std::string_view item) {
  if (!list.empty())
    list += ", ";
  list += item;
  return list;
}

}  // namespace

ForwardedHeaders forwarded_headers(const WorkerContext& w,
                                   const http::request<http::string_body>& req,
                                   const MaybeTlsStream& client, const RequestTrace& trace) {
  ForwardedHeaders f;
  // The client's fields that are passed on or extended, in one pass (the
  // first Authorization and Via, as find() gives them; every line of
  // X-Forwarded-For and Forwarded, in order). Beast has no enum for the
  // last two, so each lookup by name hashed it and walked the field set.
  const http::fields::value_type* authorization = nullptr;
  std::string_view incoming_via;
  bool has_via = false;
  std::string client_xff;
  std::string client_forwarded;
  for (const auto& field : req) {
    const http::field name = field.name();
    if (name == http::field::authorization) {
      if (authorization == nullptr)
        authorization = &field;
    } else if (name == http::field::via) {
      if (!has_via)
        incoming_via = field.value();
      has_via = true;
    } else {
      const std::string_view s = field.name_string();
      if (s.size() == 15 && beast::iequals(s, "x-forwarded-for")) {
        client_xff = appended(std::move(client_xff), field.value());
      } else if (s.size() == 9 && beast::iequals(s, "forwarded")) {
        client_forwarded = appended(std::move(client_forwarded), field.value());
      }
    }
  }
  // With gateway API keys the client's key is the gateway's to check, not
  // the engines' to see: engines get OPENAI_API_KEY's (or nothing).
  f.authorization = authorization != nullptr && w.client_keys == nullptr
                        ? std::string(authorization->value())
                        : w.default_authorization;
  if (w.loop_guard != nullptr)
    f.via = w.loop_guard->via_for_upstream(incoming_via);
  f.traceparent = trace.traceparent();
  f.tracestate = trace.tracestate();
  f.baggage = trace.baggage();
  if (const std::string& ip = client.peer_address(); !ip.empty()) {
    f.x_forwarded_for = appended(std::move(client_xff), ip);
    // RFC 7239: an IPv6 node is quoted and bracketed. (Appended in place:
    // a temporary for the element cost an allocation per request.)
    f.forwarded = std::move(client_forwarded);
    f.forwarded.reserve(f.forwarded.size() + ip.size() + 24);
    if (!f.forwarded.empty())
      f.forwarded += ", ";
    const bool v6 = client.peer_is_v6();
    f.forwarded += v6 ? "for=\"[" : "for=";
    f.forwarded += ip;
    f.forwarded += v6 ? "]\";proto=http" : ";proto=http";
  }
  for (const auto& name : w.cfg.forward_headers) {
    if (req.find(name) != req.end())
      f.extra.emplace_back(name, joined_values(req, name));
  }
  for (const auto& [name, value] : w.cfg.set_headers)
    f.extra.emplace_back(name, value);
  return f;
}

}  // namespace pdgate
