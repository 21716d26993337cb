// Spans in OTLP/HTTP's JSON encoding (the body of POST /v1/traces):
// resourceSpans -> scopeSpans -> spans, ids as lowercase hex, times and
// 64-bit integers as decimal strings (the protobuf JSON mapping).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/observability/tracing.hpp"

namespace pdgate {

// One export request's body: every span under one resource whose
// service.name is `service_name`.
std::string otlp_json(const std::vector<Span>& spans, std::string_view service_name,
                      std::string_view service_version);

}  // namespace pdgate
