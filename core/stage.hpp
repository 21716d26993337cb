// What every stage of the pipeline (encode, prefill, decode) shares: how an
// upstream request is built, how an engine's failure becomes a
// GatewayError, and the report each stage gives the picker. Defined in
// pipeline.cpp.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http.hpp>

#include "core/errors.hpp"
#include "core/instance.hpp"
#include "core/json_body.hpp"
#include "core/upstream.hpp"
#include "core/worker.hpp"

namespace pdgate {

// What every upstream request made for one client request carries from
// it: the credentials, and the Via chain that lets gateways detect loops
// (core/loop_guard.hpp).
struct ForwardedHeaders {
  std::string authorization;  // the client's, else the OPENAI_API_KEY default
  std::string via;
};

// Computed once per client request.
ForwardedHeaders forwarded_headers(const WorkerContext& w,
                                   const http::request<http::string_body>& req);

http::request<http::string_body> upstream_request(http::verb method, const Instance& inst,
                                                  std::string_view target, std::string body,
                                                  const std::string& request_id,
                                                  const ForwardedHeaders& fwd);

// The same request's header alone, for a body of `body_size` bytes sent as
// a buffer sequence (UpstreamExchange::start with buffers).
http::request_header<> upstream_head(http::verb method, const Instance& inst,
                                     std::string_view target, std::size_t body_size,
                                     const std::string& request_id, const ForwardedHeaders& fwd);

// The pieces of a spliced body as buffers for a gathering write.
std::vector<net::const_buffer> body_buffers(const SplicedText& body);

// The first `max` bytes of `s`, "..." when cut.
std::string snippet(std::string_view s, std::size_t max = 300);

// What a client is told an upstream failure was, without the engine's
// address ("timed out waiting for the engine").
const char* public_reason(UpstreamFailure kind);

// 502 "<stage> stage failed: <public reason>"; the detail names the engine.
GatewayError stage_failure(Stage stage, const UpstreamError& e);

// 503 "no healthy <stage> instance is available".
GatewayError no_instance(Stage stage);

// An engine answered with an error status: its own 4xx goes to the client
// verbatim, a 5xx becomes a 502 naming the stage. Reads the error body.
net::awaitable<GatewayError> engine_status_error(Stage stage, UpstreamExchange& ex,
                                                 const Instance& inst);

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
  void first_byte(unsigned status) {
    outcome_.status = status;
    outcome_.time_to_first_byte = since_start();
  }
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
