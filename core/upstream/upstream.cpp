#include "core/upstream/upstream.hpp"

#include <tuple>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "core/base/use_tuple.hpp"
#include "core/net/http_head.hpp"
#include "core/net/tls_context.hpp"

namespace pdgate {

namespace {

// Resolved addresses are reused for a while so a request does not pay a
// DNS round trip, but re-resolved often enough to follow a moved engine.
constexpr auto kResolveTtl = std::chrono::seconds(30);

bool is_closed_error(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof ||
         ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == net::error::connection_aborted || ec == http::error::partial_message;
}

}  // namespace

bool is_local_resource_error(const boost::system::error_code& ec) {
  if (ec.category() != boost::system::system_category() &&
      ec.category() != boost::system::generic_category())
    return false;
  switch (ec.value()) {
    case EMFILE:
    case ENFILE:
    case ENOBUFS:
    case ENOMEM:
      return true;
    default:
      return false;
  }
}

net::awaitable<std::pair<beast::error_code, tcp::resolver::results_type>> resolve_until(
    net::any_io_executor ex, const std::string& host, std::uint16_t port,
    std::chrono::steady_clock::time_point deadline) {
  auto resolver = std::make_shared<tcp::resolver>(ex);
  net::steady_timer timer(ex);
  timer.expires_at(deadline);
  // The handler may run after this frame is gone (its completion already
  // queued when the timer was destroyed): it holds only a weak reference.
  timer.async_wait([weak = std::weak_ptr<tcp::resolver>(resolver)](const beast::error_code& ec) {
    if (ec)
      return;
    if (auto r = weak.lock())
      r->cancel();
  });
  auto [ec, results] = co_await resolver->async_resolve(host, std::to_string(port),
                                                        net::as_tuple(net::use_awaitable));
  timer.cancel();
  co_return std::pair{ec, std::move(results)};
}

net::awaitable<beast::error_code> connect_stream(DeadlineSocket& stream,
                                                 const tcp::resolver::results_type& endpoints) {
  beast::error_code last = net::error::host_not_found;
  for (const auto& entry : endpoints) {
    beast::error_code ec;
    stream.socket().close(ec);
    stream.socket().open(entry.endpoint().protocol(), ec);
    if (ec)
      co_return ec;  // out of descriptors: no other endpoint will do better
    auto [cec] = co_await stream.async_connect(entry.endpoint(), net::as_tuple(net::use_awaitable));
    if (!cec || cec == beast::error::timeout)
      co_return cec;
    last = cec;
  }
  co_return last;
}

UpstreamPool::UpstreamPool(net::any_io_executor ex, InstancePtr instance, std::size_t max_idle,
                           Millis idle_timeout, const EngineTls* tls, BodyBudget* answer_budget)
    : ex_(std::move(ex)),
      instance_(std::move(instance)),
      max_idle_(max_idle),
      idle_timeout_(idle_timeout),
      tls_(tls),
      answer_budget_(answer_budget) {}

std::unique_ptr<UpstreamConnection> UpstreamPool::take_idle() {
  const auto now = std::chrono::steady_clock::now();
  // Most recently used first: it is the least likely to have been closed
  // by the engine's own keep-alive timeout.
  while (!idle_.empty()) {
    auto c = std::move(idle_.back());
    idle_.pop_back();
    if (now - c->idle_since < idle_timeout_ && c->stream.socket().is_open()) {
      c->reused = true;
      return c;
    }
  }
  return nullptr;
}

void UpstreamPool::give_back(std::unique_ptr<UpstreamConnection> c) {
  if (idle_.size() >= max_idle_)
    return;  // bounded: the surplus connection closes
  c->idle_since = std::chrono::steady_clock::now();
  c->buffer.clear();
  // Whatever read_all grew it to: a connection reused for a stream that
  // idles for minutes must not hold it. The first read's room is kept
  // (idle connections are bounded), so a request does not pay for it.
  if (c->buffer.capacity() > kFirstRead)
    c->buffer.shrink_to_fit();
  idle_.push_back(std::move(c));
}

void UpstreamPool::abort_waiting() {
  // Copy: aborting completes operations whose continuations unregister.
  const auto waiting = waiting_;
  for (auto* ex : waiting)
    ex->abort_ejected();
}

void UpstreamPool::sweep() {
  const auto now = std::chrono::steady_clock::now();
  while (!idle_.empty() && now - idle_.front()->idle_since >= idle_timeout_)
    idle_.pop_front();
}

net::awaitable<std::pair<UpstreamError, std::unique_ptr<UpstreamConnection>>> UpstreamPool::connect(
    Millis timeout, RequestScope* scope) {
  const auto& spec = instance_->spec;
  const auto now = std::chrono::steady_clock::now();
  if (!resolved_ || now - resolved_at_ > kResolveTtl) {
    // Asio resolves on its own internal thread: the event loop never
    // blocks on getaddrinfo.
    tcp::resolver resolver(ex_);
    auto [ec, results] =
        co_await resolver.async_resolve(spec.host, std::to_string(spec.port), use_tuple);
    if (ec) {
      co_return std::pair{UpstreamError{UpstreamFailure::connect,
                                        "cannot resolve " + spec.host + ": " + ec.message()},
                          nullptr};
    }
    resolved_ = results;
    resolved_at_ = now;
  }
  auto conn = std::make_unique<UpstreamConnection>(ex_);
  if (scope)
    scope->add(&conn->stream.tcp());
  // One deadline for the connect and, for https://, the handshake.
  conn->stream.expires_after(timeout);
  auto ec = co_await connect_stream(conn->stream.tcp(), *resolved_);
  std::string tls_error;
  if (!ec && spec.tls) {
    if (tls_ == nullptr) {
      tls_error = "no TLS context for https:// engines";
      ec = net::error::operation_not_supported;
    } else {
      beast::error_code ignored;
      conn->stream.socket().set_option(tcp::no_delay(true), ignored);
      std::tie(ec, tls_error) = co_await engine_handshake(conn->stream, *tls_, spec.host);
    }
  }
  if (scope)
    scope->remove(&conn->stream.tcp());
  if (ec && is_local_resource_error(ec)) {
    co_return std::pair{
        UpstreamError{UpstreamFailure::local,
                      "the gateway cannot open a connection to " + spec.url + ": " + ec.message()},
        nullptr};
  }
  if (ec) {
    resolved_.reset();  // the address may have changed
    UpstreamError err{UpstreamFailure::connect, ""};
    if (ec == beast::error::timeout) {
      err.kind = UpstreamFailure::connect_timeout;
      err.detail = std::string(spec.tls ? "connect and TLS handshake" : "connect") + " to " +
                   spec.url + " timed out after " + std::to_string(timeout.count()) + " ms";
    } else if (scope && scope->client_gone()) {
      err = {UpstreamFailure::aborted, "client went away"};
    } else if (!tls_error.empty()) {
      err.detail = "TLS handshake with " + spec.url + " failed: " + tls_error;
    } else {
      err.detail = "cannot connect to " + spec.url + ": " + ec.message();
    }
    co_return std::pair{err, nullptr};
  }
  conn->stream.expires_never();
  beast::error_code ignored;
  conn->stream.socket().set_option(tcp::no_delay(true), ignored);
  co_return std::pair{UpstreamError{}, std::move(conn)};
}

UpstreamPool& UpstreamPools::for_instance(const InstancePtr& inst) {
  auto& slot = pools_[inst->id];
  if (!slot)
    slot = std::make_unique<UpstreamPool>(ex_, inst, max_idle_, idle_timeout_, tls_.get(),
                                          answer_budget_);
  return *slot;
}

void UpstreamPools::sweep() {
  for (auto& [id, pool] : pools_)
    pool->sweep();
}

void UpstreamPools::retain(const InstanceSet& set) {
  // A pool with exchanges in flight stays: they refer to it.
  std::erase_if(pools_, [&set](const auto& kv) {
    return set.find(kv.first) == nullptr && kv.second->live == 0;
  });
}

void UpstreamPools::abort_waiting(std::uint64_t instance_id) {
  if (auto it = pools_.find(instance_id); it != pools_.end())
    it->second->abort_waiting();
}

UpstreamExchange::UpstreamExchange(UpstreamPool& pool, std::unique_ptr<UpstreamConnection> conn,
                                   RequestScope& scope, UpstreamTimeouts timeouts)
    : pool_(pool), conn_(std::move(conn)), scope_(scope), timeouts_(timeouts) {
  scope_.add(&conn_->stream.tcp());
  pool_.add_waiting(this);
  ++pool_.live;
}

UpstreamExchange::~UpstreamExchange() {
  if (charged_ != 0)
    pool_.answer_budget()->release(charged_);
  committed();
  --pool_.live;
  if (conn_) {
    scope_.remove(&conn_->stream.tcp());
    beast::error_code ec;
    conn_->stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    conn_->stream.close();
  }
}

void UpstreamExchange::committed() {
  if (waiting_)
    pool_.remove_waiting(this);
  waiting_ = false;
}

void UpstreamExchange::abort_ejected() {
  ejected_ = true;
  committed();
  if (conn_) {
    beast::error_code ec;
    conn_->stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    conn_->stream.close();
  }
}

UpstreamError UpstreamExchange::classify(const beast::error_code& ec, const char* during) const {
  const auto& url = pool_.instance()->spec.url;
  if (scope_.client_gone())
    return {UpstreamFailure::aborted, "client went away"};
  if (ejected_)
    return {UpstreamFailure::ejected, url + " was ejected " + during};
  if (ec == beast::error::timeout) {
    return {UpstreamFailure::timeout, std::string("timed out ") + during + " from " + url};
  }
  if (is_closed_error(ec)) {
    return {UpstreamFailure::closed, url + " closed the connection " + during};
  }
  if (ec == http::error::body_limit || ec == http::error::header_limit) {
    return {UpstreamFailure::too_large,
            std::string("response too large ") + during + " from " + url};
  }
  return {UpstreamFailure::protocol,
          std::string("error ") + during + " from " + url + ": " + ec.message()};
}

net::awaitable<std::pair<UpstreamError, std::unique_ptr<UpstreamExchange>>> UpstreamExchange::start(
    UpstreamPool& pool, http::request<http::string_body>& req, RequestScope& scope,
    UpstreamTimeouts timeouts) {
  const std::vector<net::const_buffer> body{net::buffer(req.body())};
  const std::string head = render_request_head(req.base());
  co_return co_await start(pool, head, body, scope, timeouts);
}

net::awaitable<std::pair<UpstreamError, std::unique_ptr<UpstreamExchange>>> UpstreamExchange::start(
    UpstreamPool& pool, std::string_view head, const std::vector<net::const_buffer>& body,
    RequestScope& scope, UpstreamTimeouts timeouts) {
  // The head, then the body's pieces: one gathering write.
  std::vector<net::const_buffer> out;
  out.reserve(body.size() + 1);
  out.push_back(net::buffer(head.data(), head.size()));
  for (const auto& b : body) {
    if (b.size() != 0)
      out.push_back(b);
  }
  for (int attempt = 0;; ++attempt) {
    if (scope.client_gone()) {
      co_return std::pair{UpstreamError{UpstreamFailure::aborted, "client went away"}, nullptr};
    }
    auto conn = attempt == 0 ? pool.take_idle() : nullptr;
    if (!conn) {
      auto [err, fresh] = co_await pool.connect(timeouts.connect, &scope);
      if (err)
        co_return std::pair{err, nullptr};
      conn = std::move(fresh);
    }
    const bool reused = conn->reused;
    std::unique_ptr<UpstreamExchange> ex(
        new UpstreamExchange(pool, std::move(conn), scope, timeouts));

    ex->conn_->stream.expires_after(timeouts.first_byte);
    beast::error_code ec;
    if (auto rest = ex->conn_->stream.write(out, ec))
      ec = co_await std::move(*rest);
    // The header, read and parsed here (a coroutine of its own would cost
    // a frame per engine call). The engine has sent nothing it was not
    // asked for: wait before reading.
    ex->conn_->drained = true;
    while (!ec && !ex->parser_.is_header_done()) {
      if (ex->conn_->buffer.size() > 0) {
        const auto pec = ex->parse_buffered();
        if (!pec)
          continue;
        if (pec != http::error::need_more) {
          ec = pec;
          break;
        }
      }
      // The first read of the answer is awaited here, not in fill's frame.
      if (ex->reads_header_directly() && ex->conn_->buffer.size() == 0)
        ec = ex->after_header_read(co_await ex->header_read(kFirstRead), kFirstRead);
      else
        ec = co_await ex->fill(kFirstRead);
    }
    if (!ec) {
      // From here on one parse takes every chunk the buffer holds, so
      // events that arrived together leave together.
      ex->parser_.eager(true);
      co_return std::pair{UpstreamError{}, std::move(ex)};
    }

    // The engine may close an idle keep-alive connection at any moment; if
    // it did so before answering anything, the request never started there.
    if (reused && attempt == 0 && is_closed_error(ec) && !ex->parser_.got_some() &&
        !scope.client_gone()) {
      continue;
    }
    co_return std::pair{ex->classify(ec, ex->parser_.got_some() ? "reading the response header"
                                                                : "waiting for the first byte"),
                        nullptr};
  }
}

// The wait until the socket has bytes (or its end, or an error), without
// a read buffer, bounded by the first-byte timeout: on expiry the socket is
// closed and beast::error::timeout returned. Not a coroutine: awaited
// directly, it adds no frame to an idle stream's chain.
net::awaitable<std::tuple<beast::error_code>> UpstreamExchange::readable_or_timeout() {
  auto& c = *conn_;
  // A wait between two pieces of the body (a stream's events) may last
  // minutes: the buffer's room is released first. The wait for the header
  // keeps it (the connection brought it from the pool, and the answer's
  // first bytes go there).
  if (parser_.is_header_done())
    release_idle_memory();
  c.stream.expires_after(timeouts_.first_byte);
  return c.stream.tcp().async_wait_readable(use_tuple);
}

beast::error_code UpstreamExchange::after_wait(const std::tuple<beast::error_code>& r) {
  const auto& [ec] = r;
  if (!ec)
    conn_->drained = false;
  return ec;
}

bool UpstreamExchange::must_wait() const {
  return !parser_.is_done() && (conn_->buffer.size() == 0 || needs_more_) && conn_->drained &&
         !conn_->stream.is_tls();
}

net::awaitable<UpstreamError> UpstreamExchange::wait_bytes() {
  if (auto ec = after_wait(co_await readable_or_timeout()); ec)
    co_return classify(ec, "while reading the response body");
  co_return UpstreamError{};
}

net::awaitable<beast::error_code> UpstreamExchange::fill(std::size_t room) {
  auto& c = *conn_;
  room = std::min(room, c.buffer.max_size() - c.buffer.size());
  if (room == 0)
    co_return http::error::buffer_overflow;
  if (c.stream.is_tls()) {
    // Bytes may wait inside the TLS layer with none on the socket: the
    // read itself waits (its room allocated meanwhile).
    c.stream.expires_after(timeouts_.first_byte);
    auto [ec, n] = co_await c.stream.async_read_some(c.buffer.prepare(room), use_tuple);
    c.buffer.commit(n);
    co_return ec;
  }
  if (reads_header_directly())
    co_return after_header_read(co_await header_read(room), room);
  for (;;) {
    if (c.drained) {
      // Awaited here, not through a coroutine of its own: one frame less
      // per wait.
      if (auto ec = after_wait(co_await readable_or_timeout()))
        co_return ec;
    }
    beast::error_code ec;
    const std::size_t n = c.stream.read_now(c.buffer.prepare(room), ec);
    if (ec == net::error::would_block) {
      c.drained = true;
      continue;
    }
    c.buffer.commit(n);
    c.drained = n < room;
    co_return ec;
  }
}

bool UpstreamExchange::reads_header_directly() const {
  return conn_->drained && !parser_.is_header_done() && !conn_->stream.is_tls();
}

// The answer's header is read as soon as it comes, into the room the
// connection keeps while in the pool (the expiry was set with the
// request). An Asio read is queued on the descriptor's registration as it
// stands, where a wait for readiness costs an epoll_ctl every time; and
// after a read that emptied the socket, Asio does not try a read that
// would find nothing before waiting. One system call per answer, as nginx
// makes.
net::awaitable<std::tuple<beast::error_code, std::size_t>> UpstreamExchange::header_read(
    std::size_t room) {
  return conn_->stream.async_read_some(conn_->buffer.prepare(room), use_tuple);
}

beast::error_code UpstreamExchange::after_header_read(
    const std::tuple<beast::error_code, std::size_t>& r, std::size_t room) {
  const auto& [ec, n] = r;
  conn_->buffer.commit(n);
  conn_->drained = n < room;
  return ec;
}

beast::error_code UpstreamExchange::parse_buffered() {
  beast::error_code ec;
  const std::size_t used = parser_.put(conn_->buffer.data(), ec);
  conn_->buffer.consume(used);
  return ec;
}

net::awaitable<UpstreamError> UpstreamExchange::read_some(std::string& out, std::size_t max) {
  if (parser_.is_done())
    co_return UpstreamError{};
  bool wanted = conn_->buffer.size() == 0 || needs_more_;
  for (;;) {
    if (wanted) {
      // Room is allocated only once bytes are there (fill), so a stream
      // idling between tokens holds no read buffer while it waits.
      if (auto ec = co_await fill(max); ec) {
        if (ec == net::error::eof) {
          // The end of the stream is told to the parser here, never waited
          // for again: a second wait after EOF could sit until the
          // first-byte timeout (an engine that died right after its header
          // held requests for 600 s). put_eof() ends a body framed by the
          // connection's close, and reports any other body as cut short.
          beast::error_code pec;
          parser_.put_eof(pec);
          co_return pec ? classify(http::error::partial_message, "while reading the response body")
                        : UpstreamError{};
        }
        co_return classify(ec, "while reading the response body");
      }
    }
    auto err = parse_into(out, max, wanted);
    if (!wanted)
      co_return err;
  }
}

UpstreamError UpstreamExchange::take_buffered(std::string& out, std::size_t max, bool& wanted) {
  wanted = !parser_.is_done() && (conn_->buffer.size() == 0 || needs_more_);
  if (wanted || parser_.is_done())
    return UpstreamError{};
  return parse_into(out, max, wanted);
}

UpstreamError UpstreamExchange::parse_into(std::string& out, std::size_t max, bool& wanted) {
  // The body bytes parsed from the buffer are fewer than the buffer
  // holds (chunk framing). A floor keeps a parse that ends in a partial
  // chunk header useful; `out` keeps its capacity meanwhile.
  const std::size_t room = std::min(max, std::max<std::size_t>(conn_->buffer.size(), 256));
  const std::size_t old = out.size();
  if (!reserve_charged(out, old + room)) {
    wanted = false;
    return UpstreamError{UpstreamFailure::over_budget,
                         "the memory for whole engine answers (--answer-memory-limit) is used up"};
  }
  out.resize(old + room);
  parser_.lend(out.data() + old, room);
  auto ec = parse_buffered();
  const std::size_t got = room - parser_.room_left();
  out.resize(old + got);
  parser_.lend(nullptr, 0);
  // need_more: the buffer is used up (its bytes were body or framing; a
  // chunk's closing CRLF stays until the next size line is there);
  // need_buffer: `out` is full and the rest stays buffered.
  needs_more_ = ec == http::error::need_more;
  wanted = needs_more_ && got == 0 && !parser_.is_done();
  if (wanted)
    return UpstreamError{};
  if (ec == http::error::need_more || ec == http::error::need_buffer)
    ec = {};
  if (ec)
    return classify(ec, "while reading the response body");
  return UpstreamError{};
}

// A whole body is wanted (a prefill's answer carries a block id per 16
// tokens: ~100 KiB for a 1 MiB prompt), so reads get room for big pieces:
// at a small read's room that was ~200 system calls. The room is
// allocated only when bytes must be read (a small answer arrives with its
// header), and the buffer shrinks again before the connection goes back
// to the pool.
constexpr std::size_t kWholeBodyRead = 64 * 1024;

UpstreamError UpstreamExchange::over_limit(std::size_t limit) const {
  return UpstreamError{UpstreamFailure::too_large, "response body from " +
                                                       pool_.instance()->spec.url + " exceeds " +
                                                       std::to_string(limit) + " bytes"};
}

bool UpstreamExchange::reserve_charged(std::string& out, std::size_t want) {
  if (want <= out.capacity() || !whole_)
    return true;
  // The growth a string would make by itself, charged before it is made:
  // many answers growing at once cannot pass the budget together.
  const std::size_t grown = std::max(want, 2 * out.capacity());
  BodyBudget* budget = pool_.answer_budget();
  if (budget != nullptr && grown > kUnchargedAnswer && grown > charged_) {
    if (!budget->try_charge(grown - charged_))
      return false;
    charged_ = grown;
  }
  out.reserve(grown);
  return true;
}

std::optional<net::awaitable<UpstreamError>> UpstreamExchange::read_all(std::string& out,
                                                                        std::size_t limit,
                                                                        UpstreamError& err) {
  whole_ = true;
  err = UpstreamError{};
  while (!parser_.is_done()) {
    bool wanted = true;
    err = take_buffered(out, kWholeBodyRead, wanted);
    if (!err && out.size() > limit)
      err = over_limit(limit);
    if (err)
      return std::nullopt;
    if (wanted)
      return read_all(out, limit);
  }
  return std::nullopt;
}

net::awaitable<UpstreamError> UpstreamExchange::read_all(std::string& out, std::size_t limit) {
  whole_ = true;
  while (!parser_.is_done()) {
    auto err = co_await read_some(out, kWholeBodyRead);
    if (err)
      co_return err;
    if (out.size() > limit)
      co_return over_limit(limit);
  }
  co_return UpstreamError{};
}

void UpstreamExchange::release_idle_memory() {
  // Often not quite empty: a chunk's closing CRLF is parsed with the next
  // chunk's size line, so it waits here for it. Shrinking keeps just those
  // bytes.
  if (conn_ && conn_->buffer.capacity() - conn_->buffer.size() >= 256)
    conn_->buffer.shrink_to_fit();
}

void UpstreamExchange::finish() {
  if (!conn_)
    return;
  scope_.remove(&conn_->stream.tcp());
  if (parser_.is_done() && parser_.keep_alive() && conn_->buffer.size() == 0 &&
      !scope_.client_gone()) {
    conn_->stream.expires_never();
    pool_.give_back(std::move(conn_));
  } else {
    beast::error_code ec;
    conn_->stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    conn_->stream.close();
    conn_.reset();
  }
}

}  // namespace pdgate
