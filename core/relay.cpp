#include "core/relay.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_cat.hpp>

#include "core/http_head.hpp"
#include "core/response_writer.hpp"

namespace pdgate {

namespace {

constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

void copy_answer_headers(const http::response_header<>& from, http::response_header<>& to) {
  // Only what describes the body travels: hop-by-hop and framing headers
  // belong to the upstream connection, not to the client's.
  for (auto field : {http::field::content_type, http::field::cache_control}) {
    auto it = from.find(field);
    if (it != from.end())
      to.set(field, it->value());
  }
}

// Writes one piece of the relayed stream as an HTTP chunk.
net::awaitable<bool> write_chunk(beast::tcp_stream& client, std::string_view data,
                                 const Config& cfg) {
  client.expires_after(cfg.client_idle_timeout);
  auto [ec, n] = co_await net::async_write(client, http::make_chunk(net::buffer(data)), use_tuple);
  co_return !ec;
}

// The stream's response header and its first events, in one write. Its
// own coroutine, so that the header is gone while the stream relays (and
// idles).
net::awaitable<bool> write_stream_start(const Config& cfg, beast::tcp_stream& client,
                                        const http::request<http::string_body>& req,
                                        UpstreamExchange& ex, const std::string& request_id,
                                        std::string_view first) {
  http::response<http::empty_body> res{static_cast<http::status>(ex.status()), req.version()};
  res.set(http::field::server, "pdgate");
  copy_answer_headers(ex.header(), res);
  if (res.find(http::field::content_type) == res.end())
    res.set(http::field::content_type, "text/event-stream");
  res.set("X-Request-Id", request_id);
  res.chunked(true);
  res.keep_alive(req.keep_alive());
  const std::string head = render_head(res.base());
  client.expires_after(cfg.client_idle_timeout);
  beast::error_code ec;
  std::size_t n = 0;
  if (first.empty()) {
    std::tie(ec, n) = co_await net::async_write(client, net::buffer(head), use_tuple);
  } else {
    std::tie(ec, n) = co_await net::async_write(
        client, beast::buffers_cat(net::buffer(head), http::make_chunk(net::buffer(first))),
        use_tuple);
  }
  co_return !ec;
}

// The rest of decode's stream after its first events went out with the
// header. If decode breaks off now, the client gets an in-band error event
// and the stream ends: never an invented finish_reason or [DONE].
net::awaitable<bool> relay_stream(WorkerContext& w, beast::tcp_stream& client,
                                  const http::request<http::string_body>& req, DecodeRelay& r,
                                  RequestScope& scope) {
  UpstreamExchange& ex = *r.ex;
  if (!co_await write_stream_start(w.cfg, client, req, ex, r.view->request_id, r.first)) {
    scope.on_client_gone();
    co_return false;
  }
  // Bytes reached the client: no failover from here on.
  ex.committed();
  // The engine's header fields are no longer needed (status and framing
  // are kept by the parser).
  ex.drop_header_fields();
  std::string().swap(r.first);
  std::string out;
  UpstreamError failure;
  while (!r.stream->done()) {
    if (auto err = co_await r.stream->read_into(out); err) {
      if (err.kind == UpstreamFailure::aborted)
        co_return false;
      failure = std::move(err);
      break;
    }
    if (!out.empty() && !co_await write_chunk(client, out, w.cfg)) {
      scope.on_client_gone();
      co_return false;
    }
    std::string().swap(out);
  }
  if (failure) {
    spdlog::warn("request {}: decode stream broke off: {}", r.view->request_id, failure.detail);
    note_failure(w, *r.decode, failure.detail);
    const std::string why = w.cfg.verbose_errors ? failure.detail : public_reason(failure.kind);
    const std::string ev =
        sse_data_event(error_json(502, "decode stage failed mid-stream: " + why));
    if (!co_await write_chunk(client, ev, w.cfg))
      co_return false;
  } else {
    ex.finish();
  }
  client.expires_after(w.cfg.client_idle_timeout);
  auto [ec, n] = co_await net::async_write(client, http::make_chunk_last(), use_tuple);
  co_return !ec && req.keep_alive();
}

// A whole decode answer, through the filter (its own frame, so the filter
// takes no room in the caller's while a stream relays).
net::awaitable<bool> relay_whole(WorkerContext& w, beast::tcp_stream& client,
                                 const http::request<http::string_body>& req, DecodeRelay& r) {
  r.ex->committed();
  DecodeOutputFilter filter(r.decode->spec.host, w.cfg.expose_kv_params,
                            r.conversation ? &r.conversation->recorder : nullptr);
  filter.on_body(r.first);
  if (filter.take_new_capture() && r.conversation && w.conversations) {
    co_await remember_turn(*w.conversations, *r.conversation, *filter.captured(),
                           w.cfg.conversation_ttl, r.view->request_id);
  }
  co_return co_await write_whole_answer(client, req, *r.ex, std::move(r.first), r.view->request_id);
}

}  // namespace

StreamRelay::StreamRelay(WorkerContext& w, UpstreamExchange& ex, const Instance& decode,
                         const std::string& request_id, OptionalTurn& conversation)
    : w_(w),
      ex_(ex),
      decode_(decode),
      request_id_(request_id),
      conversation_(conversation),
      filter_(decode.spec.host, w.cfg.expose_kv_params,
              conversation ? &conversation->recorder : nullptr) {}

net::awaitable<UpstreamError> StreamRelay::read_into(std::string& out) {
  in_.clear();
  ex_.release_idle_memory();  // before each wait, the first included
  if (auto err = co_await ex_.read_some(in_); err)
    co_return err;
  if (!scanner_.feed(in_)) {
    co_return UpstreamError{UpstreamFailure::protocol, "decode stream from " + decode_.spec.url +
                                                           " is malformed: " + scanner_.error()};
  }
  while (scanner_.next(event_))
    out += filter_.on_event(event_);
  // Stored before the client sees the end of the turn, so a client that
  // sends its next turn at once (to any replica) finds them.
  if (filter_.take_new_capture() && conversation_ && w_.conversations) {
    co_await remember_turn(*w_.conversations, *conversation_, *filter_.captured(),
                           w_.cfg.conversation_ttl, request_id_);
  }
  // Between events a stream may idle for minutes: it holds no event
  // buffers meanwhile (a few small allocations per event instead).
  // swap, not assignment: a moved-in short string keeps the old buffer.
  std::string().swap(in_);
  std::string().swap(event_.raw);
  std::string().swap(event_.data);
  scanner_.release_idle_memory();
  co_return UpstreamError{};
}

net::awaitable<bool> write_whole_answer(beast::tcp_stream& client,
                                        const http::request<http::string_body>& req,
                                        const UpstreamExchange& ex, std::string body,
                                        const std::string& request_id) {
  http::response<http::string_body> res{static_cast<http::status>(ex.status()), req.version()};
  res.set(http::field::server, "pdgate");
  copy_answer_headers(ex.header(), res);
  res.set("X-Request-Id", request_id);
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  co_return co_await write_response(client, res) && req.keep_alive();
}

net::awaitable<bool> relay_answer(WorkerContext& w, beast::tcp_stream& client,
                                  const http::request<http::string_body>& req, DecodeRelay& r,
                                  RequestScope& scope) {
  if (r.stream)
    co_return co_await relay_stream(w, client, req, r, scope);
  co_return co_await relay_whole(w, client, req, r);
}

}  // namespace pdgate
