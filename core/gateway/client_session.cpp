#include "core/gateway/client_session.hpp"

#include <sys/socket.h>

#include <tuple>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "core/base/use_tuple.hpp"
#include "core/net/errors.hpp"
#include "core/net/http_body.hpp"
#include "core/net/http_head.hpp"
#include "core/net/request_framing.hpp"
#include "core/net/request_head.hpp"
#include "core/net/response_writer.hpp"

namespace pdgate {

namespace {

// The first room a body that is still arriving gets; it doubles as the
// bytes come, up to the declared length. A client that declares 64 MiB and
// sends ten bytes holds this much, not 64 MiB.
constexpr std::size_t kFirstBodyRoom = 64 * 1024;

// The room a request's first read gets: a whole header, usually.
constexpr std::size_t kRequestRead = 4096;

enum class BodyRead { complete, over_budget, too_large, malformed, gone };

// Reads a Content-Length body of `len` bytes into `body`, straight from
// the socket (the kernel copies it into place, not into the read buffer
// first), the bytes that came with the header first. The string grows
// geometrically as bytes arrive, each growth charged to the body budget.
net::awaitable<BodyRead> read_sized_body(MaybeTlsStream& stream, beast::flat_buffer& buffer,
                                         std::string& body, std::size_t len, BodyCharge& charge) {
  std::size_t got = std::min(buffer.size(), len);
  std::size_t room = std::min(len, std::max(got, kFirstBodyRoom));
  if (!charge.grow_to(room))
    co_return BodyRead::over_budget;
  // resize() zero-fills the new room: far cheaper than the copy through
  // the read buffer it replaces.
  body.resize(room);
  net::buffer_copy(net::buffer(body.data(), got), buffer.data());
  buffer.consume(got);
  while (got < len) {
    if (got == room) {
      room = std::min(len, room * 2);
      if (!charge.grow_to(room))
        co_return BodyRead::over_budget;
      body.resize(room);
    }
    auto [ec, n] =
        co_await stream.async_read_some(net::buffer(body.data() + got, room - got), use_tuple);
    if (ec)
      co_return BodyRead::gone;  // cut short, reset, or the idle timeout closed it
    got += n;
  }
  co_return BodyRead::complete;
}

// Reads a chunked body through Beast's parser, charging the body string's
// growth to the budget after every read.
net::awaitable<BodyRead> read_chunked_body(MaybeTlsStream& stream, beast::flat_buffer& buffer,
                                           http::request_parser<AppendStringBody>& parser,
                                           BodyCharge& charge) {
  while (!parser.is_done()) {
    auto [ec, n] = co_await http::async_read_some(stream, buffer, parser, use_tuple);
    if (ec == http::error::body_limit)
      co_return BodyRead::too_large;
    if (ec == http::error::end_of_stream || ec == http::error::partial_message)
      co_return BodyRead::gone;
    // Beast's own parse errors (a bad chunk size, extension or trailer)
    // are the client's mistake and get an answer; anything else is the
    // connection's end.
    if (ec)
      co_return ec.category() == http::make_error_code(http::error::bad_chunk).category()
          ? BodyRead::malformed
          : BodyRead::gone;
    if (!charge.grow_to(parser.get().body().capacity()))
      co_return BodyRead::over_budget;
  }
  co_return BodyRead::complete;
}

// Reads until `buffer` holds a whole request header (up to its empty line)
// and returns its size, or the read's error: header_limit once `limit`
// bytes hold no end of header.
net::awaitable<std::tuple<beast::error_code, std::size_t>> read_whole_header(
    MaybeTlsStream& stream, beast::flat_buffer& buffer, std::size_t limit) {
  std::size_t scanned = 0;
  for (;;) {
    const std::string_view have(static_cast<const char*>(buffer.data().data()), buffer.size());
    const std::size_t end = have.find("\r\n\r\n", scanned);
    if (end != std::string_view::npos)
      co_return std::tuple{beast::error_code{}, end + 4};
    if (have.size() >= limit)
      co_return std::tuple{beast::error_code(http::error::header_limit), std::size_t{0}};
    scanned = have.size() < 3 ? 0 : have.size() - 3;
    const std::size_t room = std::min<std::size_t>(limit - have.size(), 4096);
    auto [ec, n] = co_await stream.async_read_some(buffer.prepare(room), use_tuple);
    if (ec)
      co_return std::tuple{ec, std::size_t{0}};
    buffer.commit(n);
  }
}

// Reads one request after its first bytes arrived; answers (and returns
// false) when it cannot be read and the connection must close. Its own
// coroutine: the parser and the refusals take no room in the session's
// frame, which lives as long as the connection.
net::awaitable<bool> read_request(const ClientSessionEnv& env, const Config& cfg,
                                  MaybeTlsStream& stream, beast::flat_buffer& buffer,
                                  http::request<http::string_body>& req, unsigned& refused) {
  http::request_parser<AppendStringBody> parser;
  // Answers a request that cannot be read to the end, then closes the way
  // nginx's lingering close does: stop sending, and read (and drop) what
  // the client is still sending for a moment. Closing with unread bytes in
  // the socket would make the kernel send a reset, and the client could
  // lose the answer that explains the refusal.
  // `req` keeps the refused request's method and target (when its header
  // was read), so the refusal is counted under its route.
  auto refuse = [&](GatewayError e) -> net::awaitable<void> {
    refused = status_of(e);
    // (Beast refuses a Content-Length over the body limit before it
    // marks the header done, with the request line already parsed.)
    if (!parser.get().target().empty()) {
      req.method(parser.get().method());
      req.target(parser.get().target());
    }
    // (Retry-After for an overloaded gateway comes with the error.)
    auto res = make_error_response(e, 11, false);
    if (!co_await write_response(stream, res))
      co_return;
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream.expires_after(std::chrono::seconds(2));
    std::size_t drained = 0;
    while (drained < cfg.max_body_bytes + (1u << 20)) {
      buffer.clear();
      auto [rec, n] = co_await stream.async_read_some(buffer.prepare(64 * 1024), use_tuple);
      if (rec)
        break;
      drained += n;
    }
  };
  // (Built only when refused: a string made for every request costs a
  // formatting and an allocation.)
  auto too_large = [&cfg] {
    return client_error(
        ErrorKind::body_too_large,
        "request body exceeds the limit of " + std::to_string(cfg.max_body_bytes) + " bytes");
  };

  stream.expires_after(cfg.header_timeout);
  // A plain header that came whole with the connection's last read is
  // parsed without Beast's parser, straight into `req`
  // (core/net/request_head.hpp); every other is read by Beast's.
  const auto plain = parse_plain_request_head(
      std::string_view(static_cast<const char*>(buffer.data().data()), buffer.size()),
      RequestHeadLimits{cfg.max_header_bytes, cfg.max_body_bytes}, req);
  if (plain) {
    buffer.consume(plain->size);
  } else {
    parser.header_limit(static_cast<std::uint32_t>(cfg.max_header_bytes));
    parser.body_limit(cfg.max_body_bytes);
    // Beast's parser reads a header only once it is whole, so it is read
    // whole first (its rest may be in the buffer already), and its lines
    // checked for what Beast would accept but RFC 9112 refuses.
    auto [header_ec, header_size] =
        co_await read_whole_header(stream, buffer, cfg.max_header_bytes);
    if (!header_ec) {
      const std::string_view raw(static_cast<const char*>(buffer.data().data()), header_size);
      if (auto folded = check_header_lines(raw)) {
        co_await refuse(std::move(*folded));
        co_return false;
      }
      const std::size_t used = parser.put(buffer.data(), header_ec);
      buffer.consume(used);
      if (!header_ec && !parser.is_header_done())
        header_ec = http::error::partial_message;  // cannot be: the header was whole
    }
    if (const auto ec = header_ec) {
      if (ec == http::error::body_limit) {
        // Beast checks Content-Length against the body limit as soon as
        // the header is complete.
        co_await refuse(too_large());
      } else if (ec == http::error::header_limit) {
        co_await refuse(client_error(
            ErrorKind::header_too_large,
            "request header exceeds " + std::to_string(cfg.max_header_bytes) + " bytes"));
      } else if (ec == beast::error::timeout) {
        // The expiry has closed the socket: as nginx does on its
        // client_header_timeout, the connection ends without an answer.
      } else if (ec != http::error::end_of_stream && ec != net::error::eof &&
                 ec != net::error::connection_reset) {
        co_await refuse(
            client_error(ErrorKind::bad_request, "malformed HTTP request: " + ec.message()));
      }
      co_return false;
    }
  }
  const http::request_header<>& head = plain ? req.base() : parser.get().base();
  if (auto bad = check_host_field(head)) {
    co_await refuse(std::move(*bad));
    co_return false;
  }
  // Before a byte of the body is read: a body framed in a way a proxy in
  // front could read differently is never read at all.
  if (auto bad = check_request_framing(head)) {
    co_await refuse(std::move(*bad));
    co_return false;
  }
  std::optional<std::uint64_t> len;
  if (plain)
    len = plain->content_length;
  else if (const auto parsed = parser.content_length())
    len = *parsed;
  if (len && *len > cfg.max_body_bytes) {
    co_await refuse(
        client_error(ErrorKind::body_too_large, "request body of " + std::to_string(*len) +
                                                    " bytes exceeds the limit of " +
                                                    std::to_string(cfg.max_body_bytes) + " bytes"));
    co_return false;
  }
  if (auto it = head.find(http::field::expect);
      it != head.end() && beast::iequals(it->value(), "100-continue")) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    auto [ec, n] = co_await net::async_write(stream, net::buffer(kContinue), use_tuple);
    if (ec)
      co_return false;
  }
  stream.expires_after(cfg.client_idle_timeout);
  BodyCharge charge(env.body_budget);
  BodyRead read = BodyRead::complete;
  std::string& body = plain ? req.body() : parser.get().body();
  if (!plain && parser.chunked()) {
    read = co_await read_chunked_body(stream, buffer, parser, charge);
  } else if (len && *len > buffer.size()) {
    read = co_await read_sized_body(stream, buffer, body, static_cast<std::size_t>(*len), charge);
  } else if (plain) {
    // The whole body came with the header.
    const auto n = static_cast<std::size_t>(*len);
    body.assign(static_cast<const char*>(buffer.data().data()), n);
    buffer.consume(n);
  } else if (!parser.is_done()) {
    // The whole body came with the header: parsed from the buffer, no I/O
    // (the asynchronous read stays for whatever that parse leaves).
    beast::error_code ec;
    parser.eager(true);
    buffer.consume(parser.put(buffer.data(), ec));
    if ((!ec || ec == http::error::need_more) && !parser.is_done()) {
      std::tie(ec, std::ignore) = co_await http::async_read(stream, buffer, parser, use_tuple);
    }
    if (ec && ec != http::error::need_more)
      read = BodyRead::gone;
  }
  switch (read) {
    case BodyRead::complete:
      break;
    case BodyRead::over_budget:
      co_await refuse(gateway_error(
          ErrorKind::overloaded,
          "the gateway is receiving too many large request bodies at once; retry later"));
      co_return false;
    case BodyRead::too_large:
      co_await refuse(too_large());
      co_return false;
    case BodyRead::malformed:
      co_await refuse(client_error(ErrorKind::bad_request, "malformed chunked request body"));
      co_return false;
    case BodyRead::gone:
      // A timeout (the socket is closed already, as nginx closes on its
      // client_body_timeout), a body cut short or a reset: nothing to
      // answer.
      co_return false;
  }
  stream.expires_never();
  if (!plain) {
    // Moved into the string_body message the handlers take (the body type
    // only changes how it was read).
    req = [&parser] {
      auto parsed = parser.release();
      return http::request<http::string_body>(std::move(parsed.base()), std::move(parsed.body()));
    }();
  }
  co_return true;
}

// Why the gateway refuses the request before any route sees it: it was
// sent round again by this gateway (or a chain of them). Empty otherwise.
std::string loop_refusal(const ClientSessionEnv& env, const http::request<http::string_body>& req) {
  if (const auto via = req.find(http::field::via); via != req.end())
    return env.loop_guard.refusal(via->value());
  return {};
}

// The answers the gateway gives without a route handler: 508 for a loop
// (so the sender counts its engine as failed instead of recursing), 404
// or 405 for a request no route takes.
net::awaitable<bool> refuse(MaybeTlsStream& stream, const http::request<http::string_body>& req,
                            RequestOutcome& outcome, std::string_view path,
                            const RouteTable::Match& route, std::string loop) {
  if (!loop.empty()) {
    auto res =
        make_error_response(gateway_error(ErrorKind::loop, std::move(loop)), req.version(), false);
    outcome.status = res.result_int();  // 508, from the error table
    co_await write_response(stream, res);
    co_return false;
  }
  const bool known = !route.allow.empty();
  auto res =
      make_error_response(client_error(known ? ErrorKind::method_not_allowed : ErrorKind::not_found,
                                       known ? "use " + route.allow + " for " + std::string(path)
                                             : "no route for " + std::string(req.method_string()) +
                                                   " " + std::string(path)),
                          req.version(), req.keep_alive());
  if (known)
    res.set(http::field::allow, route.allow);
  outcome.status = res.result_int();
  co_return co_await write_response(stream, res) && req.keep_alive();
}

// The access log's record starts with what the request line and headers say.
std::unique_ptr<RequestRecord> start_record(const http::request<http::string_body>& req,
                                            std::string_view path) {
  auto record = std::make_unique<RequestRecord>();
  RequestRecord& r = *record;
  r.received_wall = std::chrono::system_clock::now();
  r.method = std::string(req.method_string());
  r.route = std::string(path);
  if (const auto tp = req.find("traceparent"); tp != req.end())
    r.trace_id = trace_id_of(tp->value());
  return record;
}

// The request's single exit: counted, timed, and logged.
void end_request(const ClientSessionEnv& env, std::string_view path, unsigned status,
                 std::string_view stage, std::chrono::steady_clock::time_point received,
                 std::unique_ptr<RequestRecord> record) {
  env.metrics.count_request(path, status, stage);
  const auto total = std::chrono::steady_clock::now() - received;
  env.metrics.request_seconds.observe(std::chrono::duration<double>(total).count());
  if (!record || !env.access_log)
    return;
  record->status = status;
  record->stage = std::string(stage);
  record->total = std::chrono::duration_cast<std::chrono::microseconds>(total);
  env.access_log->submit(std::move(*record));
}

// The server side of a TLS handshake, bounded by the header timeout like
// a request's header: a client that stalls it, or speaks plain HTTP to the
// TLS port, is closed without holding anything but its socket.
net::awaitable<bool> accept_tls(const ClientSessionEnv& env, const Config& cfg,
                                MaybeTlsStream& stream, net::ssl::context& ctx) {
  stream.expires_after(cfg.header_timeout);
  // The TLS layer (OpenSSL's connection state and buffers, tens of KiB)
  // is made once the ClientHello's first bytes are there: until then a
  // connection costs its socket and this frame, so connections that never
  // say anything cannot fill the memory (and --max-connections bounds
  // their number, the header timeout their life).
  if (auto [wec] = co_await stream.tcp().async_wait_readable(use_tuple); wec) {
    env.metrics.tls_handshake_failures.fetch_add(1, std::memory_order_relaxed);
    co_return false;
  }
  auto& tls = stream.start_tls(ctx);
  auto [ec] = co_await tls.async_handshake(net::ssl::stream_base::server, use_tuple);
  if (!ec)
    co_return true;
  env.metrics.tls_handshake_failures.fetch_add(1, std::memory_order_relaxed);
  spdlog::debug("TLS handshake with a client failed: {}", ec.message());
  co_return false;
}

}  // namespace

net::awaitable<void> serve_client(const ClientSessionEnv& env, WorkerContext& w, tcp::socket socket,
                                  tcp::endpoint peer) {
  // The worker's settings, which a reload may change between two
  // requests (read at each use, never copied for the connection's life).
  const Config& cfg = w.cfg;
  MaybeTlsStream stream(std::move(socket));
  stream.set_peer(peer);
  // The certificate this connection was accepted with: a reload swaps the
  // listener's, this one stays until the connection ends.
  std::shared_ptr<net::ssl::context> tls = env.tls ? env.tls->current() : nullptr;
  if (tls && !co_await accept_tls(env, cfg, stream, *tls)) {
    stream.close();
    co_return;
  }
  beast::flat_buffer buffer;
  bool first = true;

  while (!env.stopping.load(std::memory_order_relaxed)) {
    // Between requests a keep-alive connection may idle; once bytes of a
    // request arrive, the whole header must follow within header_timeout.
    if (buffer.size() == 0) {
      // A buffer that grew for a large header does not keep that size
      // while the connection idles.
      if (buffer.capacity() > 2 * kRequestRead)
        buffer.shrink_to_fit();
      stream.expires_after(first ? cfg.header_timeout : cfg.client_idle_timeout);
      auto [ec, n] = co_await stream.async_read_some(buffer.prepare(kRequestRead), use_tuple);
      if (ec)
        break;
      buffer.commit(n);
    }
    first = false;

    http::request<http::string_body> req;
    unsigned refused = 0;
    if (!co_await read_request(env, cfg, stream, buffer, req, refused)) {
      // A request refused before it was read whole (413, 400, 501, 503)
      // still counts under its route, decided by the gateway.
      if (refused != 0 && !req.target().empty()) {
        const std::string_view path = path_of(req.target());
        if (env.routes.find(req.method(), path).counted) {
          end_request(env, path, refused, "gateway", std::chrono::steady_clock::now(),
                      env.access_log ? start_record(req, path) : nullptr);
        }
      }
      break;
    }
    env.active_requests.fetch_add(1);
    ++w.requests_started;
    auto watched = std::make_shared<WatchedRequest>();
    RequestScope& scope = watched->scope;
    RequestOutcome outcome;
    // The client's socket is watched once the request has lasted a
    // moment, whatever it sent past the request (those bytes wait for the
    // next request). The read buffer, if empty then, is released at that
    // moment too: a streamed answer can last minutes, and need not keep
    // 4 KiB meanwhile (with 10,000 open streams that is 40 MiB of nothing).
    w.client_watches.watch_later(watched, stream.socket(), stream.is_tls(), &buffer);
    const std::string_view path = path_of(req.target());
    const auto route = env.routes.find(req.method(), path);
    if (route.counted && env.access_log)
      outcome.record = start_record(req, path);
    // The handler is awaited from this frame: a streamed answer holds no
    // dispatching frame between the session and the handler for its life.
    bool keep_alive = false;
    if (std::string loop = loop_refusal(env, req); !loop.empty() || route.handler == nullptr) {
      keep_alive = co_await refuse(stream, req, outcome, path, route, std::move(loop));
    } else {
      ClientRequest call{w, stream, req, scope, outcome};
      keep_alive = co_await (*route.handler)(call);
    }
    ClientWatches::end(*watched);
    if (route.counted) {
      // 499 (as nginx logs it): the client left before an answer was written.
      if (outcome.record)
        outcome.record->client_left = scope.client_gone();
      end_request(env, path, outcome.status != 0 ? outcome.status : 499, outcome.stage,
                  outcome.received, std::move(outcome.record));
    }
    env.active_requests.fetch_sub(1);
    if (!keep_alive || scope.client_gone())
      break;
  }
  // Over TLS no close_notify is sent: waiting for the client's would hold
  // the connection, and every answer is framed (Content-Length or chunked),
  // so a client can tell a complete one from a cut one without it.
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream.close();
}

}  // namespace pdgate
