// What one client request came to, gathered while it is served and read
// once at its single exit (core/gateway/client_session.cpp): the status
// and stage counted in the metrics, and the record handed to the access
// log (core/gateway/access_log.hpp). What the request holds open, and its
// cancellation when the client leaves, is core/net/request_scope.hpp's.
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

// The policy of each stage as the request's worker ran them (a reload may
// change them): its name, as in metrics, and its version (a hash of its
// text, as /admin/config shows it; empty when not known).
struct StagePolicies {
  std::string encode;
  std::string prefill;
  std::string decode;
  std::string encode_version;
  std::string prefill_version;
  std::string decode_version;
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
  // Streams resumed on another decode after theirs broke off, and the
  // decodes that broke (comma-separated URLs; `decode` is the last leg's).
  unsigned migrations = 0;
  std::string migrated_from;
  // Multi-turn reuse: "hit", "miss", or empty when the request named no
  // conversation (or reuse is off).
  const char* conversation = "";
  StagePolicies policies;  // named for the stages that chose an instance
  // Why a policy refused the request ("decode:declined", "request:rejected",
  // GatewayError::reason); empty when none did.
  std::string reject;
  // The client key's name (--api-keys), empty without keys; the path the
  // request took: "pd" (prefill, then decode) or "one_hop", empty when it
  // was not routed.
  std::string tenant;
  const char* path = "";
};

// The outcome of one request: status and stage for /metrics, the record
// for the access log, the tokens for the client key's limit.
struct RequestOutcome {
  // The status the client was answered with (0: none, the client left)
  // and the stage that decided it ("gateway" when no engine did).
  unsigned status = 0;
  const char* stage = "gateway";
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
  // For the access log, read at the request's exit; null when the log is
  // off, so that a held stream does not carry it.
  std::unique_ptr<RequestRecord> record;
  // Prompt + completion tokens the engine reported (its `usage`), for the
  // client key's tokens-per-minute limit.
  std::uint64_t tokens_used = 0;
  void count_sent(std::size_t bytes) {
    if (record)
      record->bytes_sent += bytes;
  }
};

}  // namespace pdgate
