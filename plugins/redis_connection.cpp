// hiredis's asynchronous C interface lives in this file (replies are copied out
// by copy_reply, plugins/redis_protocol.cpp).
//
// hiredis's async API owns the socket, the parser and the queue of reply
// callbacks; it asks its event library to watch the socket through five
// hooks (addRead/delRead/addWrite/delWrite/cleanup). The adapter below
// implements them with a posix::stream_descriptor on the worker's
// executor: async_wait(wait_read|wait_write), then redisAsyncHandleRead or
// redisAsyncHandleWrite. hiredis owns the fd and closes it, so the
// descriptor is release()d, never closed.
#include "plugins/redis_connection.hpp"
#include "core/base/use_tuple.hpp"

#include <sys/socket.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include <algorithm>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace pdgate {

namespace {

using Clock = std::chrono::steady_clock;

// The socket watch of one hiredis context. Shared by the pending waits so
// that a wait completing after the context is gone finds `alive` false
// instead of a freed context.
struct SocketWatch {
  SocketWatch(net::any_io_executor ex, int fd) : sd(std::move(ex), fd) {}
  net::posix::stream_descriptor sd;
  redisAsyncContext* ac = nullptr;
  bool alive = true;
  bool want_read = false, want_write = false;
  bool reading = false, writing = false;
};
using WatchPtr = std::shared_ptr<SocketWatch>;

void arm_read(const WatchPtr& w) {
  if (w->reading || !w->want_read || !w->alive)
    return;
  w->reading = true;
  w->sd.async_wait(net::posix::stream_descriptor::wait_read,
                   [w](const boost::system::error_code& ec) {
                     w->reading = false;
                     if (ec || !w->alive)
                       return;
                     // May free the context (EOF, protocol error): cleanup clears `alive`.
                     if (w->want_read) {
                       redisAsyncHandleRead(w->ac);
                       // hiredis buffers a bulk string until it is whole:
                       // past the bound the server is broken or hostile.
                       // Shutting the socket down makes hiredis see the
                       // close, fail what waits, and the client reconnect.
                       const redisReader* r = w->alive ? w->ac->c.reader : nullptr;
                       if (r != nullptr && r->len - r->pos > kMaxReplyBytes)
                         ::shutdown(w->ac->c.fd, SHUT_RDWR);
                     }
                     arm_read(w);
                   });
}

void arm_write(const WatchPtr& w) {
  if (w->writing || !w->want_write || !w->alive)
    return;
  w->writing = true;
  w->sd.async_wait(net::posix::stream_descriptor::wait_write,
                   [w](const boost::system::error_code& ec) {
                     w->writing = false;
                     if (ec || !w->alive)
                       return;
                     if (w->want_write)
                       redisAsyncHandleWrite(w->ac);
                     arm_write(w);
                   });
}

WatchPtr& watch_of(void* privdata) {
  return *static_cast<WatchPtr*>(privdata);
}

void ev_add_read(void* p) {
  auto& w = watch_of(p);
  w->want_read = true;
  arm_read(w);
}
void ev_del_read(void* p) {
  watch_of(p)->want_read = false;
}
void ev_add_write(void* p) {
  auto& w = watch_of(p);
  w->want_write = true;
  arm_write(w);
}
void ev_del_write(void* p) {
  watch_of(p)->want_write = false;
}
void ev_cleanup(void* p) {
  auto* holder = static_cast<WatchPtr*>(p);
  WatchPtr w = std::move(*holder);
  delete holder;
  w->alive = false;
  boost::system::error_code ec;
  w->sd.cancel(ec);
  // hiredis closes the fd right after this hook returns.
  w->sd.release();
}

void attach(redisAsyncContext* ac, const net::any_io_executor& ex) {
  auto w = std::make_shared<SocketWatch>(ex, ac->c.fd);
  w->ac = ac;
  ac->ev.data = new WatchPtr(std::move(w));
  ac->ev.addRead = ev_add_read;
  ac->ev.delRead = ev_del_read;
  ac->ev.addWrite = ev_add_write;
  ac->ev.delWrite = ev_del_write;
  ac->ev.cleanup = ev_cleanup;
}

// A command waiting for its reply. The waiter sleeps on `timer` until the
// deadline; the reply callback cancels the timer to wake it early.
struct Pending {
  explicit Pending(const net::any_io_executor& ex) : timer(ex) {}
  net::steady_timer timer;
  bool done = false;
  RedisReply reply;
};
using PendingPtr = std::shared_ptr<Pending>;

std::string context_error(const redisAsyncContext* ac, const char* fallback) {
  return ac->err != 0 && ac->errstr[0] != '\0' ? std::string(ac->errstr) : std::string(fallback);
}

}  // namespace

// hiredis calls these with the context whose `data` is the connection.
struct RedisConnection::Callbacks {
  static void on_reply(redisAsyncContext* ac, void* reply, void* privdata) {
    auto* holder = static_cast<PendingPtr*>(privdata);
    PendingPtr p = std::move(*holder);
    delete holder;
    auto* conn = static_cast<RedisConnection*>(ac->data);
    if (!conn->sent_.empty())
      conn->sent_.pop_front();
    // A null reply: the context is going away (disconnect or free).
    p->reply = reply != nullptr ? copy_reply(static_cast<redisReply*>(reply))
                                : no_reply(context_error(ac, "connection closed"));
    p->done = true;
    p->timer.cancel();
  }

  // Subscriber mode: hiredis keeps this callback for the channel and calls
  // it with the confirmation (["subscribe", channel, n]), every message
  // (["message", channel, payload]) and, null, when the context goes away.
  static void on_subscription(redisAsyncContext* ac, void* reply, void* /*privdata*/) {
    auto* conn = static_cast<RedisConnection*>(ac->data);
    if (reply == nullptr || conn->stopped_ || conn->ac_ != ac)
      return;
    const RedisReply r = copy_reply(static_cast<redisReply*>(reply));
    if (r.type != RedisReply::Type::array || r.elements.size() < 3)
      return;
    const std::string& kind = r.elements[0].text;
    if (kind == "subscribe" && conn->on_subscribed_) {
      conn->on_subscribed_();
    } else if (kind == "message" && conn->on_message_ &&
               r.elements[2].type == RedisReply::Type::string) {
      conn->on_message_(r.elements[2].text);
    }
  }

  static void on_connect(const redisAsyncContext* ac, int status) {
    auto* conn = static_cast<RedisConnection*>(ac->data);
    if (status == REDIS_OK)
      return;  // the handshake's PING says when it is usable
    // hiredis frees the context after this callback.
    if (conn->ac_ == ac) {
      conn->ac_ = nullptr;
      conn->sent_.clear();
      conn->set_ready(false);
      conn->last_error_ = "connect: " + context_error(ac, "failed");
    }
    conn->notify();
  }

  static void on_disconnect(const redisAsyncContext* ac, int /*status*/) {
    auto* conn = static_cast<RedisConnection*>(ac->data);
    if (conn->ac_ == ac) {
      conn->ac_ = nullptr;
      conn->sent_.clear();
      conn->set_ready(false);
      conn->last_error_ = context_error(ac, "connection closed by the server");
    }
    conn->notify();
  }
};

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
  if (switch_watch_)
    switch_watch_->cancel();
  if (ac_ != nullptr) {
    auto* ac = ac_;
    ac_ = nullptr;
    redisAsyncFree(ac);
  }
  set_ready(false);
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
}

void RedisConnection::drop(const std::string& why) {
  if (switch_watch_) {
    switch_watch_->cancel();
    switch_watch_.reset();
  }
  if (ac_ == nullptr)
    return;
  redisAsyncContext* ac = ac_;
  ac_ = nullptr;
  sent_.clear();
  set_ready(false);
  last_error_ = why;
  // Completes every pending command with no reply; deferred by hiredis if
  // we are inside one of its callbacks.
  redisAsyncFree(ac);
  notify();
}

net::awaitable<RedisReply> RedisConnection::send(const std::vector<std::string_view>& args,
                                                 std::chrono::milliseconds wait) {
  if (ac_ == nullptr)
    co_return no_reply("not connected to redis");
  if (sent_.size() >= settings_.max_in_flight) {
    co_return no_reply("too many redis commands in flight");
  }
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (auto a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto p = std::make_shared<Pending>(ex_);
  auto* holder = new PendingPtr(p);
  if (redisAsyncCommandArgv(ac_, &Callbacks::on_reply, holder, static_cast<int>(argv.size()),
                            argv.data(), lens.data()) != REDIS_OK) {
    delete holder;
    co_return no_reply("redis connection is closing");
  }
  sent_.push_back(Clock::now());
  p->timer.expires_after(wait);
  if (!p->done)
    co_await p->timer.async_wait(use_tuple);
  if (!p->done) {
    co_return no_reply("no reply from redis within " + std::to_string(wait.count()) + " ms");
  }
  co_return std::move(p->reply);
}

net::awaitable<RedisReply> RedisConnection::command(std::vector<std::string_view> args) {
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
  if (r.type == RedisReply::Type::none && ac_ != nullptr && !sent_.empty()) {
    // One slow reply is Redis being busy; nothing answered for many
    // timeouts in a row is a hung server or a half-open connection:
    // replace it rather than queue every request behind it.
    const auto stall = std::max<std::chrono::milliseconds>(settings_.command_timeout * 10,
                                                           std::chrono::milliseconds(500));
    if (Clock::now() - sent_.front() > stall)
      drop("redis stopped answering");
  }
  co_return r;
}

net::awaitable<bool> RedisConnection::find_master(std::string& host, std::uint16_t& port,
                                                  std::string& why) {
  auto master = co_await ask_sentinels_for_master(ex_, settings_.endpoint, sentinel_preferred_,
                                                  settings_.connect_timeout);
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
      ex_, settings_.endpoint, sentinel_preferred_, settings_.connect_timeout,
      [weak, host, port](const SentinelAddress& to) {
        auto self = weak.lock();
        if (!self || self->stopped_ || (to.host == host && to.port == port))
          return;
        spdlog::info("redis {}: the sentinels moved the master to {}:{}; reconnecting",
                     self->settings_.endpoint.display(), to.host, to.port);
        self->drop("the master moved to " + to.host + ":" + std::to_string(to.port));
      });
}

net::awaitable<bool> RedisConnection::connect_once(std::string& why) {
  const RedisEndpoint& ep = settings_.endpoint;
  std::string host = ep.host;
  std::uint16_t port = ep.port;
  if (ep.is_sentinel() && !co_await find_master(host, port, why))
    co_return false;
  const auto deadline = Clock::now() + settings_.connect_timeout;
  redisAsyncContext* ac = nullptr;
  if (ep.is_unix) {
    ac = redisAsyncConnectUnix(ep.path.c_str());
  } else {
    // hiredis would call getaddrinfo on this thread: resolve names with
    // Asio (off the loop) and hand hiredis an address.
    std::string address = host;
    boost::system::error_code ec;
    net::ip::make_address(address, ec);
    if (ec) {
      net::ip::tcp::resolver resolver(ex_);
      auto [rec, results] = co_await resolver.async_resolve(host, std::to_string(port), use_tuple);
      if (rec || results.empty()) {
        why = "cannot resolve " + host + ": " + rec.message();
        co_return false;
      }
      address = results.begin()->endpoint().address().to_string();
    }
    ac = redisAsyncConnect(address.c_str(), port);
  }
  if (ac == nullptr) {
    why = "out of memory";
    co_return false;
  }
  if (ac->err != 0) {
    why = "connect: " + context_error(ac, "failed");
    redisAsyncFree(ac);
    co_return false;
  }
  ac->data = this;
  bound_reply_reader(ac->c.reader);
  attach(ac, ex_);
  ac_ = ac;
  // Hooks first: setting the connect callback arms the first write wait.
  redisAsyncSetConnectCallback(ac, &Callbacks::on_connect);
  redisAsyncSetDisconnectCallback(ac, &Callbacks::on_disconnect);

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
    if (ac_ == nullptr && !last_error_.empty() && r.type == RedisReply::Type::none) {
      why = last_error_;
    }
    co_return false;
  };
  // Commands queue in hiredis until the connect completes; the handshake
  // is pipelined and each reply checked in order.
  // (Named vectors: GCC 12 miscompiles braced lists of literals inside a
  // co_await expression.)
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
      ok = false;
    }
  }
  if (ok && !channel_.empty()) {
    // The callback stays registered for the channel: no per-call state.
    const char* argv[] = {"SUBSCRIBE", channel_.c_str()};
    const std::size_t lens[] = {9, channel_.size()};
    if (ac_ == nullptr || redisAsyncCommandArgv(ac_, &Callbacks::on_subscription, nullptr, 2, argv,
                                                lens) != REDIS_OK) {
      why = "SUBSCRIBE: connection closing";
      ok = false;
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
    if (co_await self->connect_once(why)) {
      backoff.reset();
      if (self->announced_down_) {
        spdlog::info("redis {}: connected again; conversation cache in use", where);
      } else if (!self->ever_connected_) {
        spdlog::debug("redis {}: connected", where);
      }
      self->ever_connected_ = true;
      self->announced_down_ = false;
      while (self->ac_ != nullptr && !self->stopped_) {
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
