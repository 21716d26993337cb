// One HTTP request and its answer on a connection of the sim, and every way
// the sim writes that answer: a whole response, or an SSE stream event by
// event. Writing goes through here so the request record (status, first
// byte, first token, outcome) is kept the same way for every endpoint.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <spdlog/fwd.h>

#include "core/net/maybe_tls_stream.hpp"
#include "sim/metrics.hpp"
#include "sim/request_log.hpp"
#include "sim/responses.hpp"

namespace pdgate::sim {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;

inline constexpr auto use_nothrow = net::as_tuple(net::use_awaitable);
using Request = http::request<http::string_body>;

// Wall-clock milliseconds since the epoch, as request records carry them.
std::int64_t now_ms();

// A body as the sim sends it: compact, invalid UTF-8 replaced.
std::string dump(const ojson& j);

// One request/response exchange on a connection.
struct Exchange {
  Exchange(MaybeTlsStream& s, beast::flat_buffer& b, Request& r, Counters& c, spdlog::logger& l)
      : sock(s), buf(b), req(r), counters(c), log(l) {}
  MaybeTlsStream& sock;
  beast::flat_buffer& buf;
  Request& req;
  Counters& counters;  // the engine's: aborts and faults that fire are counted
  spdlog::logger& log;
  std::shared_ptr<RequestRecord> rec;  // null for introspection paths
  std::string rid;                     // X-Request-Id or generated
  bool client_gone = false;            // a write failed
  bool closed = false;                 // we closed the socket on purpose
  bool response_started = false;
  std::size_t events_written = 0;
  std::optional<std::size_t> die_after;
  std::optional<std::size_t> error_after;
  std::optional<std::size_t> stall_after;
};

// Sleeps; false when cancelled (the client left).
awaitable<bool> sleep_for(std::chrono::microseconds d);
// Never completes unless cancelled.
awaitable<void> hang_forever();

// Runs `work` while watching the socket for the client leaving. Returns
// whether the connection stays open.
awaitable<bool> watched(Exchange& x, awaitable<void> work);

// A complete (non-streaming) response. Returns whether to keep the
// connection open.
awaitable<bool> reply(Exchange& x, http::status status, std::string body,
                      std::string_view content_type, bool keep_alive = true);
// vLLM's error JSON with `code` as the status.
awaitable<bool> send_error(Exchange& x, int code, std::string message);

// An SSE stream: the headers, one `data:` event per call, then the
// terminating chunk. Each returns false once the stream is over early (the
// client left, or a stream fault fired: faults.hpp).
awaitable<bool> write_stream_headers(Exchange& x);
awaitable<bool> write_event(Exchange& x, std::string data);
awaitable<bool> end_stream(Exchange& x);

}  // namespace pdgate::sim
