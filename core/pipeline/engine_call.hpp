// How an engine call is made for a client request: the request and its
// head, the span it reports on, the body buffers, and the report each
// stage gives the picker that chose its instance.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>

#include "core/base/json_body.hpp"
#include "core/base/json_edit.hpp"
#include "core/net/errors.hpp"
#include "core/observability/tracing.hpp"
#include "core/pipeline/forwarded_headers.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

// Engines' error bodies are short messages.
inline constexpr std::size_t kMaxErrorBody = 1u << 20;

// `traceparent`, when given, is the engine call's own (its span's); else
// fwd.traceparent is sent.
http::request<http::string_body> upstream_request(http::verb method, const Instance& inst,
                                                  std::string_view target, std::string body,
                                                  const std::string& request_id,
                                                  const ForwardedHeaders& fwd,
                                                  std::string_view traceparent = {});

// The same request's head alone, rendered (request line, fields, empty
// line), for a body of `body_size` bytes sent as a buffer sequence
// (UpstreamExchange::start with buffers). Written directly: Beast's field
// container allocates per field, and this runs twice per request.
// A POST's body is `content_type` (application/json unless given).
std::string upstream_head(http::verb method, const Instance& inst, std::string_view target,
                          std::size_t body_size, const std::string& request_id,
                          const ForwardedHeaders& fwd, std::string_view traceparent = {},
                          std::string_view content_type = {});

// The engine call failed with `e`: its span says how.
void trace_error(StageSpan& span, const GatewayError& e);
// The token counts of an engine's whole JSON answer (its `usage`), on the
// call's span; nothing when the span is not recorded or has none.
void trace_usage(StageSpan& span, std::string_view answer);

// The pieces of a spliced body as buffers for a gathering write.
std::vector<net::const_buffer> body_buffers(const SplicedText& body);

// The first `max` bytes of `s`, "..." when cut.
std::string snippet(std::string_view s, std::size_t max = 300);

// Reports a stage's outcome to the picker that chose its instance, when the
// stage ends however it ends (policies learn from failures too).
class StageReport {
 public:
  StageReport(InstancePicker& picker, const InstancePtr& inst, const PickContext& ctx)
      : picker_(picker), inst_(inst), ctx_(ctx), start_(std::chrono::steady_clock::now()) {
    outcome_.stage = ctx.stage;
  }
  StageReport(const StageReport&) = delete;
  StageReport& operator=(const StageReport&) = delete;
  ~StageReport() {
    outcome_.total = since_start();
    picker_.on_complete(*inst_, ctx_, outcome_);
  }
  void header(unsigned status) {
    outcome_.status = status;
    outcome_.time_to_header = since_start();
  }
  // The stage's first token arrived at `at` (see PickOutcome).
  void first_token(std::chrono::steady_clock::time_point at) {
    outcome_.time_to_first_token =
        std::chrono::duration_cast<std::chrono::microseconds>(at - start_);
  }
  void first_token() { first_token(std::chrono::steady_clock::now()); }
  std::chrono::steady_clock::time_point started() const { return start_; }
  void succeeded() { outcome_.ok = true; }

 private:
  std::chrono::microseconds since_start() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                                 start_);
  }
  InstancePicker& picker_;
  InstancePtr inst_;
  const PickContext& ctx_;
  std::chrono::steady_clock::time_point start_;
  PickOutcome outcome_;
};

}  // namespace pdgate
