// Writing the sim's answers (http_exchange.hpp), and watching the socket
// while a request is worked on so a client that leaves stops the work.
#include "sim/http_exchange.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http.hpp>

#include "sim/faults.hpp"

namespace pdgate::sim {

namespace {

// Reads the socket while a request is being worked on. Completes when the
// peer closes (EOF/reset) or when cancelled because the work finished. Bytes
// that arrive meanwhile (a pipelined request) are kept for the next parse.
awaitable<void> watch_disconnect(MaybeTlsStream& sock, beast::flat_buffer& buf) {
  std::array<char, 4096> tmp;
  for (;;) {
    auto [ec, n] = co_await sock.async_read_some(net::buffer(tmp), use_nothrow);
    if (ec)
      co_return;
    auto mb = buf.prepare(n);
    net::buffer_copy(mb, net::buffer(tmp.data(), n));
    buf.commit(n);
  }
}

}  // namespace

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string dump(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

awaitable<bool> sleep_for(std::chrono::microseconds d) {
  net::steady_timer t(co_await net::this_coro::executor, d);
  auto [ec] = co_await t.async_wait(use_nothrow);
  co_return !ec;
}

awaitable<void> hang_forever() {
  net::steady_timer t(co_await net::this_coro::executor, net::steady_timer::time_point::max());
  co_await t.async_wait(use_nothrow);
}

awaitable<bool> watched(Exchange& x, awaitable<void> work) {
  using namespace net::experimental::awaitable_operators;
  auto r = co_await (std::move(work) || watch_disconnect(x.sock, x.buf));
  const bool gone = r.index() == 1 || x.client_gone;
  if (x.rec && x.rec->outcome == Outcome::in_progress) {
    x.rec->ended_at_ms = now_ms();
    if (gone) {
      x.rec->outcome = Outcome::aborted;
      ++x.counters.aborted;
      x.log.info("request {} aborted: client went away", x.rid);
    } else {
      x.rec->outcome = Outcome::error;
    }
  }
  co_return !gone && !x.closed && x.req.keep_alive();
}

awaitable<bool> reply(Exchange& x, http::status status, std::string body,
                      std::string_view content_type, bool keep_alive) {
  http::response<http::string_body> res{status, x.req.version() ? x.req.version() : 11};
  res.set(http::field::server, "pdgate-sim");
  if (!content_type.empty())
    res.set(http::field::content_type, content_type);
  if (x.rec)
    res.set("x-request-id", x.rid);
  res.keep_alive(keep_alive && x.req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  if (x.rec)
    x.rec->first_byte_at_ms = now_ms();
  x.response_started = true;
  auto [ec, n] = co_await http::async_write(x.sock, res, use_nothrow);
  if (ec) {
    x.client_gone = true;
    co_return false;
  }
  if (x.rec) {
    x.rec->status = static_cast<int>(status);
    x.rec->ended_at_ms = now_ms();
    x.rec->outcome = static_cast<int>(status) < 400 ? Outcome::completed : Outcome::error;
  }
  co_return res.keep_alive();
}

awaitable<bool> send_error(Exchange& x, int code, std::string message) {
  std::string body = dump(make_error(message, code));
  co_return co_await reply(x, static_cast<http::status>(code), std::move(body), "application/json");
}

awaitable<bool> write_stream_headers(Exchange& x) {
  http::response<http::empty_body> res{http::status::ok, x.req.version()};
  res.set(http::field::server, "pdgate-sim");
  res.set(http::field::content_type, "text/event-stream; charset=utf-8");
  res.set(http::field::cache_control, "no-cache");
  res.set("x-request-id", x.rid);
  res.keep_alive(x.req.keep_alive());
  res.chunked(true);
  http::response_serializer<http::empty_body> sr{res};
  if (x.rec)
    x.rec->first_byte_at_ms = now_ms();
  x.response_started = true;
  auto [ec, n] = co_await http::async_write_header(x.sock, sr, use_nothrow);
  if (ec) {
    x.client_gone = true;
    co_return false;
  }
  if (x.rec)
    x.rec->status = 200;
  // A fault due after 0 events fires right after the headers.
  co_return co_await fire_stream_faults(x);
}

awaitable<bool> write_event(Exchange& x, std::string data) {
  auto [ec, n] =
      co_await net::async_write(x.sock, http::make_chunk(net::buffer(data)), use_nothrow);
  if (ec) {
    x.client_gone = true;
    co_return false;
  }
  ++x.events_written;
  if (x.rec && x.rec->stream_sent.size() < kMaxStreamRecord)
    x.rec->stream_sent.append(data, 0, kMaxStreamRecord - x.rec->stream_sent.size());
  if (x.rec && !x.rec->first_token_at_ms)
    x.rec->first_token_at_ms = now_ms();
  co_return co_await fire_stream_faults(x);
}

awaitable<bool> end_stream(Exchange& x) {
  auto [ec, n] = co_await net::async_write(x.sock, http::make_chunk_last(), use_nothrow);
  if (ec) {
    x.client_gone = true;
    co_return false;
  }
  if (x.rec) {
    x.rec->ended_at_ms = now_ms();
    x.rec->outcome = Outcome::completed;
  }
  co_return true;
}

}  // namespace pdgate::sim
