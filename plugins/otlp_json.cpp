#include "plugins/otlp_json.hpp"

#include <nlohmann/json.hpp>

namespace pdgate {

namespace {

using Json = nlohmann::json;

Json attribute_json(const SpanAttribute& a) {
  Json value;
  if (const auto* s = std::get_if<std::string>(&a.value)) {
    value["stringValue"] = *s;
  } else {
    value["intValue"] = std::to_string(std::get<std::int64_t>(a.value));
  }
  return {{"key", a.key}, {"value", std::move(value)}};
}

Json span_json(const Span& s) {
  Json j = {{"traceId", to_hex(s.trace_id)},
            {"spanId", to_hex(s.span_id)},
            {"name", s.name},
            {"kind", static_cast<int>(s.kind)},
            {"startTimeUnixNano", std::to_string(s.start_ns)},
            {"endTimeUnixNano", std::to_string(s.end_ns)}};
  if (!is_zero(s.parent_id))
    j["parentSpanId"] = to_hex(s.parent_id);
  if (!s.trace_state.empty())
    j["traceState"] = s.trace_state;
  Json attributes = Json::array();
  for (const auto& a : s.attributes)
    attributes.push_back(attribute_json(a));
  j["attributes"] = std::move(attributes);
  // STATUS_CODE_ERROR is 2; an unset status (0) says nothing went wrong.
  if (s.error) {
    j["status"] = {{"code", 2}, {"message", s.status_message}};
  }
  return j;
}

}  // namespace

std::string otlp_json(const std::vector<Span>& spans, std::string_view service_name,
                      std::string_view service_version) {
  Json list = Json::array();
  for (const auto& s : spans)
    list.push_back(span_json(s));
  Json resource = {{"attributes", Json::array({{{"key", "service.name"},
                                                {"value", {{"stringValue", service_name}}}}})}};
  Json scope = {{"name", "pdgate"}, {"version", service_version}};
  Json body = {{"resourceSpans",
                Json::array({{{"resource", std::move(resource)},
                              {"scopeSpans", Json::array({{{"scope", std::move(scope)},
                                                           {"spans", std::move(list)}}})}}})}};
  // Replaces invalid UTF-8 (a client's path) instead of throwing.
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace pdgate
