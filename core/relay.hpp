// Relaying decode's answer to the client. A stream's events go out as
// they complete, those that arrived together in one write; a whole answer
// goes out once read. Decode's output passes through the conversation
// filter (core/conversation.hpp), which captures and hides
// kv_transfer_params.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include "core/conversation.hpp"
#include "core/request_context.hpp"
#include "core/sse.hpp"
#include "core/stage.hpp"

namespace pdgate {

// Reads decode's event stream and turns it into the bytes the client
// gets: complete SSE events only (a read that ends mid-event keeps the
// partial event for the next), through the output filter.
class StreamRelay {
 public:
  StreamRelay(WorkerContext& w, UpstreamExchange& ex, const Instance& decode,
              const std::string& request_id, OptionalTurn& conversation);

  bool done() const { return ex_.done(); }

  // One read from decode; appends the client bytes it completed to `out`
  // (possibly none).
  net::awaitable<UpstreamError> read_into(std::string& out);
  // Whether decode's kv_transfer_params for the next turn were seen.
  bool captured_params() const { return filter_.captured().has_value(); }

 private:
  WorkerContext& w_;
  UpstreamExchange& ex_;
  const Instance& decode_;
  const std::string& request_id_;
  const OptionalTurn& conversation_;
  SseScanner scanner_;
  SseEvent event_;
  DecodeOutputFilter filter_;
  std::string in_;
};

// Decode answered 2xx and the client's first bytes are ready: a stream's
// first events (or its end), or a whole answer's body. Handed from the
// routing phases to the relay.
// One allocation holds it all (it lives as long as the stream).
struct DecodeRelay {
  std::unique_ptr<RequestView> view;
  InFlightGuard guard;
  std::optional<StageReport> report;  // refers to the request's PickContext
  std::unique_ptr<UpstreamExchange> ex;
  InstancePtr decode;
  OptionalTurn conversation;          // the turn whose answer may be stored
  std::optional<StreamRelay> stream;  // empty: a whole answer
  std::string first;                  // the stream's first events, or the whole body
  StageSpan span;                     // the decode call's: ends with the relay
};

// Writes decode's answer to the client: the header with the first bytes,
// then the rest. Returns whether the client connection may be reused.
net::awaitable<bool> relay_answer(WorkerContext& w, beast::tcp_stream& client,
                                  const http::request<http::string_body>& req, DecodeRelay& r,
                                  RequestScope& scope);

// A non-streaming engine answer as the client gets it: the status, the
// headers that describe the body, the body.
net::awaitable<bool> write_whole_answer(beast::tcp_stream& client,
                                        const http::request<http::string_body>& req,
                                        const UpstreamExchange& ex, std::string body,
                                        const std::string& request_id);

}  // namespace pdgate
