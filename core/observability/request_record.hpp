// What one client request did, gathered while it is served and read once
// at its single exit (core/gateway/client_session.cpp), where it is counted in the
// metrics and handed to the access log (core/gateway/access_log.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/observability/metrics.hpp"

namespace pdgate {

struct Instance;

// The policy of each stage, as the request's worker had them configured
// (a reload may change them).
struct StagePolicies {
  std::string encode;
  std::string prefill;
  std::string decode;
};

struct RequestRecord {
  std::chrono::system_clock::time_point received_wall{};
  std::string method;
  std::string route;
  std::string request_id;
  // The trace the request belongs to: the client's `traceparent` trace id
  // when it sent a valid one (32 hex digits), else empty. Tracing sets
  // this from its own trace context when it starts one.
  std::string trace_id;
  std::string model;
  bool stream = false;
  unsigned status = 0;       // 499: the client left before an answer was written
  bool client_left = false;  // before or during the answer
  std::string stage;         // the stage that decided the answer
  // The instances that served each stage (the last attempt's).
  std::vector<std::shared_ptr<const Instance>> encode;
  std::shared_ptr<const Instance> prefill;
  std::shared_ptr<const Instance> decode;
  // From the request's arrival to decode's first data event (a stream) or
  // its whole answer; absent when none came.
  std::optional<std::chrono::microseconds> ttft;
  std::chrono::microseconds total{0};
  std::uint64_t bytes_sent = 0;  // response body bytes written to the client
  std::optional<TokenUsage> usage;
  unsigned retries = 0;
  // Multi-turn reuse: "hit", "miss", or empty when the request named no
  // conversation (or reuse is off).
  const char* conversation = "";
  StagePolicies policies;  // named for the stages that chose an instance
};

// The trace id of a W3C `traceparent` header value
// ("00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>"), or empty when
// the value is not one (an all-zero trace id is invalid).
std::string trace_id_of(std::string_view traceparent);

}  // namespace pdgate
