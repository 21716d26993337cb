// The connection's I/O: an Asio stream (MaybeTlsStream: TCP, TLS over TCP
// for rediss://, or a unix socket's descriptor) owns the socket; hiredis's
// redisReader turns the bytes read into replies (copied out by copy_reply,
// plugins/redis_protocol.cpp), bounded by bound_reply_reader.
//
// Each connection made is a Link: its stream, its parser, the commands
// written and not answered yet (Redis answers in order), and the bytes not
// written yet. The Link outlives the RedisConnection's interest in it: its
// reading coroutine holds it, and finds `owner` null once the connection
// dropped it, instead of a connection that moved on to another Link.
#include "plugins/redis_connection.hpp"
#include "core/base/use_tuple.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <deque>

#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include "core/base/url.hpp"
#include "core/net/maybe_tls_stream.hpp"
#include "core/observability/prometheus.hpp"
#include "core/upstream/upstream.hpp"

namespace pdgate {

namespace {

namespace beast = boost::beast;
using Clock = std::chrono::steady_clock;
using tcp = net::ip::tcp;

// A command waiting for its reply. The waiter sleeps on `timer` until the
// deadline; the reply wakes it early by cancelling the timer.
struct Pending {
  explicit Pending(const net::any_io_executor& ex) : timer(ex) {}
  net::steady_timer timer;
  Clock::time_point sent;
  bool done = false;
  RedisReply reply;
};
using PendingPtr = std::shared_ptr<Pending>;

void complete(Pending& p, RedisReply reply) {
  p.reply = std::move(reply);
  p.done = true;
  p.timer.cancel();
}

// Bytes read at once: pdgate's replies are small; a large one (the shared
// registry's document) takes a few reads.
constexpr std::size_t kReadChunk = 16 * 1024;

std::string error_text(const beast::error_code& ec) {
  if (ec == beast::error::timeout)
    return "timed out";
  if (ec == net::error::eof)
    return "connection closed by the server";
  return ec.message();
}

}  // namespace

struct RedisConnection::Link {
  explicit Link(tcp::socket socket) : stream(std::move(socket)), reader(redisReaderCreate()) {
    if (reader != nullptr)
      bound_reply_reader(reader);
  }
  ~Link() {
    if (reader != nullptr)
      redisReaderFree(reader);
  }
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  MaybeTlsStream stream;
  redisReader* reader;
  // The connection this link serves; null once it was dropped.
  RedisConnection* owner = nullptr;
  // Commands written, oldest first, each answered by the next reply.
  std::deque<PendingPtr> pending;
  // Subscriber mode: replies with no command waiting are the channel's.
  bool subscribed = false;
  // Commands not written yet, and those being written (one write at a
  // time; commands issued meanwhile gather in `out` and leave together).
  std::string out;
  std::string writing;
  bool write_in_flight = false;
  std::array<char, kReadChunk> buf;
};

std::string_view to_string(RedisErrorKind k) {
  switch (k) {
    case RedisErrorKind::connect:
      return "connect";
    case RedisErrorKind::tls:
      return "tls";
    case RedisErrorKind::handshake:
      return "handshake";
    case RedisErrorKind::timeout:
      return "timeout";
    case RedisErrorKind::closed:
      return "closed";
    case RedisErrorKind::protocol:
      return "protocol";
    case RedisErrorKind::count:
      break;
  }
  return "unknown";
}

void write_redis_metrics(PrometheusText& m, const std::vector<RedisStatsRow>& rows) {
  if (rows.empty())
    return;
  m.gauge("pdgate_redis_connected",
          "Redis connections usable now, by the part of pdgate holding them (0: Redis is "
          "unreachable from it).");
  for (const auto& r : rows)
    m.sample("pdgate_redis_connected", {{"role", r.role}}, r.stats->connected.load());
  m.counter("pdgate_redis_reconnects_total", "Redis connections made again after one was lost.");
  for (const auto& r : rows)
    m.sample("pdgate_redis_reconnects_total", {{"role", r.role}}, r.stats->reconnects.load());
  m.counter("pdgate_redis_errors_total",
            "Redis failures by kind: connect (resolve, connect), tls (handshake, certificate), "
            "handshake (AUTH, SELECT, PING, ROLE refused), timeout (a command not answered in "
            "time), closed (connection lost), protocol (not RESP, or past the bounds).");
  for (const auto& r : rows) {
    for (int k = 0; k < static_cast<int>(RedisErrorKind::count); ++k) {
      m.sample("pdgate_redis_errors_total",
               {{"role", r.role}, {"kind", to_string(static_cast<RedisErrorKind>(k))}},
               r.stats->errors[k].load(std::memory_order_relaxed));
    }
  }
}

std::shared_ptr<RedisConnection> RedisConnection::create(net::any_io_executor ex,
                                                         RedisConnectionSettings settings,
                                                         RedisConnectionsShared& shared) {
  return std::shared_ptr<RedisConnection>(
      new RedisConnection(std::move(ex), std::move(settings), shared));
}

RedisConnection::RedisConnection(net::any_io_executor ex, RedisConnectionSettings settings,
                                 RedisConnectionsShared& shared)
    : ex_(std::move(ex)), settings_(std::move(settings)), shared_(shared), signal_(ex_) {}

RedisConnection::~RedisConnection() {
  stopped_ = true;
  drop("connection closed");
}

void RedisConnection::subscribe(std::string channel,
                                std::function<void(std::string_view)> on_message,
                                std::function<void()> on_subscribed) {
  channel_ = std::move(channel);
  on_message_ = std::move(on_message);
  on_subscribed_ = std::move(on_subscribed);
}

void RedisConnection::start() {
  net::co_spawn(ex_, run(shared_from_this()), net::detached);
}

void RedisConnection::stop() {
  stopped_ = true;
  drop("stopping");
  on_message_ = nullptr;
  on_subscribed_ = nullptr;
  notify();
}

void RedisConnection::set_ready(bool r) {
  if (r == ready_)
    return;
  ready_ = r;
  shared_.ready_connections.fetch_add(r ? 1 : -1, std::memory_order_relaxed);
  if (settings_.context.stats)
    settings_.context.stats->connected.fetch_add(r ? 1 : -1, std::memory_order_relaxed);
}

void RedisConnection::drop(const std::string& why) {
  if (switch_watch_) {
    switch_watch_->cancel();
    switch_watch_.reset();
  }
  if (!link_)
    return;
  const std::shared_ptr<Link> link = std::move(link_);
  link->owner = nullptr;
  set_ready(false);
  last_error_ = why;
  // Every command waiting gets no reply; their waiters resume later, on
  // the loop, not inside this call.
  for (auto& p : link->pending)
    complete(*p, no_reply(why));
  link->pending.clear();
  link->stream.close();
  notify();
}

void RedisConnection::link_failed(Link& link, RedisErrorKind kind, const std::string& why) {
  if (link.owner != this || link_.get() != &link)
    return;
  count(kind);
  drop(why);
}

void RedisConnection::on_reply(Link& link, RedisReply reply) {
  if (!link.pending.empty()) {
    const PendingPtr p = std::move(link.pending.front());
    link.pending.pop_front();
    complete(*p, std::move(reply));
    return;
  }
  if (!link.subscribed) {
    link_failed(link, RedisErrorKind::protocol, "a reply to no command");
    return;
  }
  // Subscriber mode: the confirmation (["subscribe", channel, n]) and every
  // message (["message", channel, payload]).
  if (stopped_ || reply.type != RedisReply::Type::array || reply.elements.size() < 3)
    return;
  const std::string& kind = reply.elements[0].text;
  if (kind == "subscribe" && on_subscribed_) {
    on_subscribed_();
  } else if (kind == "message" && on_message_ &&
             reply.elements[2].type == RedisReply::Type::string) {
    on_message_(reply.elements[2].text);
  }
}

net::awaitable<void> RedisConnection::read_loop(std::shared_ptr<Link> link) {
  for (;;) {
    auto [ec, n] = co_await link->stream.async_read_some(net::buffer(link->buf), use_tuple);
    RedisConnection* owner = link->owner;
    if (owner == nullptr)
      co_return;
    if (ec) {
      owner->link_failed(*link, RedisErrorKind::closed, error_text(ec));
      co_return;
    }
    if (redisReaderFeed(link->reader, link->buf.data(), n) != REDIS_OK) {
      owner->link_failed(*link, RedisErrorKind::protocol, "protocol error");
      co_return;
    }
    for (;;) {
      RedisReply r;
      const ReaderStatus got = next_reply(link->reader, r);
      if (got == ReaderStatus::need_more)
        break;
      if (got == ReaderStatus::error) {
        owner->link_failed(*link, RedisErrorKind::protocol, r.text);
        co_return;
      }
      owner->on_reply(*link, std::move(r));
      // A subscriber's callback, or a bad reply, may have dropped it.
      if (link->owner == nullptr)
        co_return;
    }
    // The reader buffers a bulk string until it is whole: past the bound
    // the server is broken or hostile.
    if (link->reader->len - link->reader->pos > kMaxReplyBytes) {
      owner->link_failed(*link, RedisErrorKind::protocol, "a reply larger than the bound");
      co_return;
    }
  }
}

net::awaitable<void> RedisConnection::finish_write(std::shared_ptr<Link> link,
                                                   net::awaitable<beast::error_code> rest) {
  const beast::error_code ec = co_await std::move(rest);
  link->write_in_flight = false;
  RedisConnection* owner = link->owner;
  if (owner == nullptr)
    co_return;
  if (ec)
    owner->link_failed(*link, RedisErrorKind::closed, "write: " + error_text(ec));
  else
    owner->flush(link);
}

void RedisConnection::flush(const std::shared_ptr<Link>& link) {
  if (link->write_in_flight || link->out.empty())
    return;
  link->writing.clear();
  std::swap(link->out, link->writing);
  beast::error_code ec;
  // A plain socket usually takes the commands at once: no asynchronous
  // operation at all (MaybeTlsStream::write).
  auto rest = link->stream.write(net::buffer(link->writing), ec);
  if (ec) {
    link_failed(*link, RedisErrorKind::closed, "write: " + ec.message());
    return;
  }
  if (!rest)
    return;
  link->write_in_flight = true;
  net::co_spawn(ex_, finish_write(link, std::move(*rest)), net::detached);
}

net::awaitable<RedisReply> RedisConnection::send(const std::vector<std::string_view>& args,
                                                 std::chrono::milliseconds wait) {
  if (!link_)
    co_return no_reply("not connected to redis");
  if (link_->pending.size() >= settings_.max_in_flight)
    co_return no_reply("too many redis commands in flight");
  auto p = std::make_shared<Pending>(ex_);
  p->sent = Clock::now();
  append_resp_command(link_->out, args);
  link_->pending.push_back(p);
  flush(link_);
  if (!p->done) {
    p->timer.expires_after(wait);
    co_await p->timer.async_wait(use_tuple);
  }
  if (!p->done) {
    count(RedisErrorKind::timeout);
    co_return no_reply("no reply from redis within " + std::to_string(wait.count()) + " ms");
  }
  co_return std::move(p->reply);
}

net::awaitable<RedisReply> RedisConnection::command(std::vector<std::string_view> args) {
  if (!ready_ && !connect_settled_ && !stopped_) {
    // The gateway has just started and this connection is still being
    // made (resolve, connect, TLS, AUTH): a command sent now waits for it,
    // within its own timeout, rather than fail at once (a rate limiter's
    // admission would fail open). A few polls, only at start.
    const auto deadline = Clock::now() + settings_.command_timeout;
    net::steady_timer wait(ex_);
    while (!ready_ && !connect_settled_ && !stopped_ && Clock::now() < deadline) {
      wait.expires_after(std::chrono::milliseconds(5));
      co_await wait.async_wait(use_tuple);
    }
  }
  if (!ready_)
    co_return no_reply("redis is not connected");
  RedisReply r = co_await send(args, settings_.command_timeout);
  if (is_readonly_error(r)) {
    // The server we knew as the master is a replica now (a Sentinel
    // failover, or an operator's REPLICAOF): reconnecting asks the
    // sentinels where the master went.
    drop("the redis server became a read-only replica");
    co_return r;
  }
  if (r.type == RedisReply::Type::none && link_ && !link_->pending.empty()) {
    // One slow reply is Redis being busy; nothing answered for many
    // timeouts in a row is a hung server or a half-open connection:
    // replace it rather than queue every request behind it.
    const auto stall = std::max<std::chrono::milliseconds>(settings_.command_timeout * 10,
                                                           std::chrono::milliseconds(500));
    if (Clock::now() - link_->pending.front()->sent > stall)
      drop("redis stopped answering");
  }
  co_return r;
}

net::awaitable<bool> RedisConnection::find_master(std::string& host, std::uint16_t& port,
                                                  std::string& why) {
  auto master =
      co_await ask_sentinels_for_master(ex_, settings_.endpoint, settings_.context.tls.get(),
                                        sentinel_preferred_, settings_.connect_timeout);
  if (!master) {
    why = master.error();
    co_return false;
  }
  host = master->host;
  port = master->port;
  co_return true;
}

void RedisConnection::watch_for_switch(const std::string& host, std::uint16_t port) {
  std::weak_ptr<RedisConnection> weak = weak_from_this();
  switch_watch_ = watch_master_switch(
      ex_, settings_.endpoint, settings_.context.tls.get(), sentinel_preferred_,
      settings_.connect_timeout, [weak, host, port](const SentinelAddress& to) {
        auto self = weak.lock();
        if (!self || self->stopped_ || (to.host == host && to.port == port))
          return;
        spdlog::info("redis {}: the sentinels moved the master to {}:{}; reconnecting",
                     self->settings_.endpoint.display(), to.host, to.port);
        self->drop("the master moved to " + to.host + ":" + std::to_string(to.port));
      });
}

net::awaitable<bool> RedisConnection::open_link(const std::string& host, std::uint16_t port,
                                                Clock::time_point deadline, std::string& why) {
  const RedisEndpoint& ep = settings_.endpoint;
  std::shared_ptr<Link> link;
  if (ep.is_unix) {
    // A unix socket's connect completes or fails at once (a full backlog
    // is EAGAIN, not a wait). Its descriptor then serves as a stream
    // socket under the TCP type: only reads, writes and close are used on
    // it, which do not look at the address family.
    net::local::stream_protocol::socket unix_socket(ex_);
    auto [ec] = co_await unix_socket.async_connect(net::local::stream_protocol::endpoint(ep.path),
                                                   use_tuple);
    if (ec) {
      why = "connect: " + ec.message();
      count(RedisErrorKind::connect);
      co_return false;
    }
    tcp::socket socket(ex_);
    socket.assign(tcp::v4(), unix_socket.release(), ec);
    if (ec) {
      why = "connect: " + ec.message();
      count(RedisErrorKind::connect);
      co_return false;
    }
    link = std::make_shared<Link>(std::move(socket));
  } else {
    // Names are resolved off the loop (Asio's resolver thread).
    auto [rec, endpoints] = co_await resolve_until(ex_, host, port, deadline);
    if (rec) {
      why = "cannot resolve " + host + ": " + rec.message();
      count(RedisErrorKind::connect);
      co_return false;
    }
    link = std::make_shared<Link>(tcp::socket(ex_));
    link->stream.expires_at(deadline);
    if (auto ec = co_await connect_stream(link->stream.tcp(), endpoints); ec) {
      why = "connect: " + error_text(ec);
      count(RedisErrorKind::connect);
      co_return false;
    }
    // Commands are small and answered one by one: no Nagle delay.
    beast::error_code ignored;
    link->stream.socket().set_option(tcp::no_delay(true), ignored);
    if (ep.tls) {
      const EngineTls* tls = settings_.context.tls.get();
      if (tls == nullptr) {
        why = "rediss:// without a TLS context";
        count(RedisErrorKind::tls);
        co_return false;
      }
      // Checked against the URL's host, or the address the sentinels gave.
      auto [hec, cause] = co_await engine_handshake(link->stream, *tls, host);
      if (hec) {
        why = "TLS handshake with " + host_port(host, port) + ": " + cause;
        count(RedisErrorKind::tls);
        co_return false;
      }
    }
    // Replies may be long apart: the stall detector (command()) bounds
    // the waits from here.
    link->stream.expires_never();
  }
  if (link->reader == nullptr) {
    why = "out of memory";
    co_return false;
  }
  if (stopped_) {
    why = "stopping";
    co_return false;
  }
  link->owner = this;
  link_ = link;
  net::co_spawn(ex_, read_loop(std::move(link)), net::detached);
  co_return true;
}

net::awaitable<bool> RedisConnection::connect_once(std::string& why) {
  const RedisEndpoint& ep = settings_.endpoint;
  std::string host = ep.host;
  std::uint16_t port = ep.port;
  if (ep.is_sentinel() && !co_await find_master(host, port, why)) {
    count(RedisErrorKind::connect);
    co_return false;
  }
  const auto deadline = Clock::now() + settings_.connect_timeout;
  if (!co_await open_link(host, port, deadline, why))
    co_return false;

  auto remaining = [&] {
    return std::max<std::chrono::milliseconds>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
        std::chrono::milliseconds(1));
  };
  auto step = [&](std::vector<std::string_view> args, std::string_view expect,
                  const char* what) -> net::awaitable<bool> {
    RedisReply r = co_await send(args, remaining());
    if (r.type == RedisReply::Type::status && (expect.empty() || r.text == expect))
      co_return true;
    why = std::string(what) + ": " + (r.text.empty() ? "unexpected reply" : r.text);
    if (!link_ && !last_error_.empty() && r.type == RedisReply::Type::none) {
      why = last_error_;
    } else if (r.type != RedisReply::Type::none) {
      count(RedisErrorKind::handshake);
    }
    co_return false;
  };
  // The handshake is sent one command at a time, each reply checked in
  // order. (Named vectors: GCC 12 miscompiles braced lists of literals
  // inside a co_await expression.)
  bool ok = true;
  if (!ep.password.empty()) {
    std::vector<std::string_view> auth{std::string_view("AUTH")};
    if (!ep.username.empty())
      auth.push_back(ep.username);
    auth.push_back(ep.password);
    ok = co_await step(std::move(auth), "OK", "AUTH");
  }
  const std::string db = std::to_string(ep.db);
  if (ok && ep.db != 0) {
    std::vector<std::string_view> select{std::string_view("SELECT"), db};
    ok = co_await step(std::move(select), "OK", "SELECT");
  }
  if (ok) {
    std::vector<std::string_view> ping{std::string_view("PING")};
    ok = co_await step(std::move(ping), "PONG", "PING");
  }
  if (ok && ep.is_sentinel()) {
    // During a failover a sentinel may still name the old master after
    // it came back as a replica: writing there would fail or be lost.
    std::vector<std::string_view> role{std::string_view("ROLE")};
    RedisReply r = co_await send(role, remaining());
    if (!is_master_role(r)) {
      why = host + ":" + std::to_string(port) + " is not a master (a failover is in progress?)";
      count(RedisErrorKind::handshake);
      ok = false;
    }
  }
  if (ok && !channel_.empty()) {
    if (!link_) {
      why = last_error_;
      ok = false;
    } else {
      // From now on a reply with no command waiting is the channel's.
      const std::vector<std::string_view> sub{std::string_view("SUBSCRIBE"), channel_};
      append_resp_command(link_->out, sub);
      link_->subscribed = true;
      flush(link_);
      if (!link_) {
        why = "SUBSCRIBE: " + last_error_;
        ok = false;
      }
    }
  }
  if (!ok) {
    drop(why);
    co_return false;
  }
  if (ep.is_sentinel())
    watch_for_switch(host, port);
  set_ready(true);
  co_return true;
}

net::awaitable<void> RedisConnection::run(std::shared_ptr<RedisConnection> self) {
  // Behind Sentinel an outage ends with a promotion a few seconds after it
  // began: retry often enough to follow it within a second.
  const auto reconnect_max =
      self->settings_.endpoint.is_sentinel()
          ? std::min(self->settings_.reconnect_max, std::chrono::milliseconds(1000))
          : self->settings_.reconnect_max;
  Backoff backoff(self->settings_.reconnect_min, reconnect_max);
  const std::string where = self->settings_.endpoint.display();
  while (!self->stopped_) {
    std::string why;
    const bool connected = co_await self->connect_once(why);
    self->connect_settled_ = true;
    if (connected) {
      backoff.reset();
      if (self->announced_down_) {
        spdlog::info("redis {}: connected again; conversation cache in use", where);
      } else if (!self->ever_connected_) {
        spdlog::debug("redis {}: connected", where);
      }
      if (self->ever_connected_ && self->settings_.context.stats)
        self->settings_.context.stats->reconnects.fetch_add(1, std::memory_order_relaxed);
      self->ever_connected_ = true;
      self->announced_down_ = false;
      while (self->link_ && !self->stopped_) {
        self->signal_.expires_at(Clock::time_point::max());
        co_await self->signal_.async_wait(use_tuple);
      }
      why = self->last_error_;
    }
    if (self->stopped_)
      co_return;
    // One warning per outage, not one per retry.
    if (!self->announced_down_) {
      spdlog::warn("redis {}: unavailable ({}); turns proceed as cache misses, reconnecting", where,
                   why);
      self->announced_down_ = true;
    }
    self->signal_.expires_after(backoff.next());
    co_await self->signal_.async_wait(use_tuple);
  }
}

}  // namespace pdgate
