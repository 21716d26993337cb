#include "plugins/otlp_json.hpp"

#include "core/base/json_body.hpp"

namespace pdgate {

namespace {

// Written directly rather than through a JSON DOM: building one node per
// field cost ~90k instructions per span, more than the request it traces
// (bench/README.md, tracing overhead). Strings go through json_quote,
// which escapes and replaces invalid UTF-8 (a client's path).
// A string value: copied as is when nothing in it needs escaping (the
// usual case: URLs, ids, stage names), else through json_quote.
void append_quoted(std::string& out, std::string_view value) {
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x80 || c == '"' || c == '\\') {
      out += json_quote(value);
      return;
    }
  }
  out += '"';
  out += value;
  out += '"';
}

// Keys are pdgate's own literals: no escaping needed.
void append_string(std::string& out, std::string_view key, std::string_view value) {
  out += '"';
  out += key;
  out += "\":";
  append_quoted(out, value);
}

void append_attribute(std::string& out, const SpanAttribute& a) {
  out += "{\"key\":\"";
  out += a.key;
  out += '"';
  if (const auto* s = std::get_if<std::string>(&a.value)) {
    out += ",\"value\":{\"stringValue\":";
    append_quoted(out, *s);
  } else {
    // int64 is a decimal string in the protobuf JSON mapping.
    out += ",\"value\":{\"intValue\":\"";
    out += std::to_string(std::get<std::int64_t>(a.value));
    out += '"';
  }
  out += "}}";
}

void append_span(std::string& out, const Span& s) {
  out += "{\"traceId\":\"";
  out += to_hex(s.trace_id);
  out += "\",\"spanId\":\"";
  out += to_hex(s.span_id);
  out += '"';
  if (!is_zero(s.parent_id)) {
    out += ",\"parentSpanId\":\"";
    out += to_hex(s.parent_id);
    out += '"';
  }
  if (!s.trace_state.empty()) {
    out += ',';
    append_string(out, "traceState", s.trace_state);
  }
  out += ',';
  append_string(out, "name", s.name);
  out += ",\"kind\":";
  out += std::to_string(static_cast<int>(s.kind));
  out += ",\"startTimeUnixNano\":\"";
  out += std::to_string(s.start_ns);
  out += "\",\"endTimeUnixNano\":\"";
  out += std::to_string(s.end_ns);
  out += "\",\"attributes\":[";
  for (std::size_t i = 0; i < s.attributes.size(); ++i) {
    if (i > 0)
      out += ',';
    append_attribute(out, s.attributes[i]);
  }
  out += ']';
  // STATUS_CODE_ERROR is 2; an unset status (0) says nothing went wrong.
  if (s.error) {
    out += ",\"status\":{\"code\":2,";
    append_string(out, "message", s.status_message);
    out += '}';
  }
  out += '}';
}

}  // namespace

std::string otlp_json(const std::vector<Span>& spans, std::string_view service_name,
                      std::string_view service_version) {
  std::string out;
  out.reserve(256 + spans.size() * 640);
  out += "{\"resourceSpans\":[{\"resource\":{\"attributes\":[{\"key\":\"service.name\",";
  out += "\"value\":{\"stringValue\":";
  append_quoted(out, service_name);
  out += "}}]},\"scopeSpans\":[{\"scope\":{\"name\":\"pdgate\",";
  append_string(out, "version", service_version);
  out += "},\"spans\":[";
  for (std::size_t i = 0; i < spans.size(); ++i) {
    if (i > 0)
      out += ',';
    append_span(out, spans[i]);
  }
  out += "]}]}]}";
  return out;
}

}  // namespace pdgate
