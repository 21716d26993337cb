#include "plugins/redis_sentinel.hpp"

#include <hiredis/hiredis.h>

#include <array>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "core/base/use_tuple.hpp"
#include "core/net/maybe_tls_stream.hpp"
#include "core/upstream/upstream.hpp"

namespace pdgate {

namespace {

namespace beast = boost::beast;
using Clock = std::chrono::steady_clock;

// Whole RESP replies from one socket, parsed by hiredis's reader with
// pdgate's bounds (a sentinel is as untrusted as any server).
class RespReader {
 public:
  RespReader() : r_(redisReaderCreate()) {
    if (r_ != nullptr)
      bound_reply_reader(r_);
  }
  ~RespReader() {
    if (r_ != nullptr)
      redisReaderFree(r_);
  }
  RespReader(const RespReader&) = delete;
  RespReader& operator=(const RespReader&) = delete;

  // The next reply; one of type none saying why when the socket fails, its
  // deadline passes or the bytes are not RESP.
  net::awaitable<RedisReply> next(MaybeTlsStream& s) {
    if (r_ == nullptr)
      co_return no_reply("out of memory");
    for (;;) {
      RedisReply out;
      if (next_reply(r_, out) != ReaderStatus::need_more)
        co_return out;
      auto [ec, n] = co_await s.async_read_some(net::buffer(buf_), use_tuple);
      if (ec)
        co_return no_reply(ec == beast::error::timeout ? "timed out" : ec.message());
      if (redisReaderFeed(r_, buf_.data(), n) != REDIS_OK)
        co_return no_reply("protocol error");
    }
  }

 private:
  redisReader* r_;
  std::array<char, 4096> buf_{};
};

// Connects `stream` to the sentinel (and shakes hands over TLS for
// rediss+sentinel://, the certificate checked against the sentinel's host)
// and sends AUTH when the URL gave a sentinel password; an empty string on
// success, else why not.
net::awaitable<std::string> open_sentinel(MaybeTlsStream& stream, RespReader& reader,
                                          const RedisEndpoint& ep, const EngineTls* tls,
                                          const SentinelAddress& s, Clock::time_point deadline) {
  auto [rec, endpoints] = co_await resolve_until(stream.get_executor(), s.host, s.port, deadline);
  if (rec)
    co_return "cannot resolve: " + rec.message();
  stream.expires_at(deadline);
  if (auto ec = co_await connect_stream(stream.tcp(), endpoints); ec)
    co_return "connect: " + (ec == beast::error::timeout ? std::string("timed out") : ec.message());
  if (ep.tls) {
    if (tls == nullptr)
      co_return std::string("rediss+sentinel:// without a TLS context");
    if (auto [hec, cause] = co_await engine_handshake(stream, *tls, s.host); hec)
      co_return "TLS handshake: " + cause;
  }
  if (ep.sentinel_password.empty())
    co_return std::string();
  const std::string auth = resp_command({"AUTH", ep.sentinel_password});
  auto [wec, wn] = co_await net::async_write(stream, net::buffer(auth), use_tuple);
  if (wec)
    co_return "write: " + wec.message();
  RedisReply r = co_await reader.next(stream);
  if (r.type != RedisReply::Type::status || r.text != "OK")
    co_return "AUTH: " + (r.text.empty() ? std::string("unexpected reply") : r.text);
  co_return std::string();
}

std::string where(const SentinelAddress& s) {
  return (s.host.find(':') != std::string::npos ? "[" + s.host + "]" : s.host) + ":" +
         std::to_string(s.port);
}

net::awaitable<Result<SentinelAddress>> ask_one(net::any_io_executor ex, const RedisEndpoint& ep,
                                                const EngineTls* tls, const SentinelAddress& s,
                                                std::chrono::milliseconds budget) {
  MaybeTlsStream stream(ex);
  RespReader reader;
  const auto deadline = Clock::now() + budget;
  if (std::string why = co_await open_sentinel(stream, reader, ep, tls, s, deadline); !why.empty())
    co_return fail(why);
  const std::string ask = resp_command({"SENTINEL", "get-master-addr-by-name", ep.master_name});
  auto [wec, wn] = co_await net::async_write(stream, net::buffer(ask), use_tuple);
  if (wec)
    co_return fail("write: " + wec.message());
  RedisReply r = co_await reader.next(stream);
  if (r.type == RedisReply::Type::none)
    co_return fail(r.text);
  co_return interpret_master_address(r);
}

class Watch final : public SentinelWatch, public std::enable_shared_from_this<Watch> {
 public:
  Watch(net::any_io_executor ex, RedisEndpoint ep, const EngineTls* tls, std::size_t index,
        std::chrono::milliseconds connect_timeout,
        std::function<void(const SentinelAddress&)> on_switch)
      : stream_(std::move(ex)),
        ep_(std::move(ep)),
        tls_(tls),
        index_(index),
        connect_timeout_(connect_timeout),
        on_switch_(std::move(on_switch)) {}

  void cancel() override {
    cancelled_ = true;
    beast::error_code ec;
    stream_.socket().close(ec);
  }

  static net::awaitable<void> run(std::shared_ptr<Watch> self) {
    const SentinelAddress& s = self->ep_.sentinels[self->index_];
    RespReader reader;
    std::string why = co_await open_sentinel(self->stream_, reader, self->ep_, self->tls_, s,
                                             Clock::now() + self->connect_timeout_);
    if (why.empty()) {
      const std::string sub = resp_command({"SUBSCRIBE", "+switch-master"});
      auto [wec, wn] = co_await net::async_write(self->stream_, net::buffer(sub), use_tuple);
      if (wec)
        why = wec.message();
    }
    // Messages may be hours apart: no deadline while subscribed; the
    // connection's owner cancels the watch when it reconnects or stops.
    self->stream_.expires_never();
    while (why.empty() && !self->cancelled_) {
      RedisReply r = co_await reader.next(self->stream_);
      if (r.type == RedisReply::Type::none) {
        why = r.text;
        break;
      }
      // ["message", "+switch-master", "<name> <old> <port> <new> <port>"]
      if (r.type != RedisReply::Type::array || r.elements.size() != 3 ||
          r.elements[0].text != "message")
        continue;
      if (auto to = switch_master_target(r.elements[2].text, self->ep_.master_name)) {
        if (!self->cancelled_ && self->on_switch_)
          self->on_switch_(*to);
      }
    }
    if (!self->cancelled_) {
      spdlog::debug("redis sentinel {}: +switch-master watch ended ({})", where(s), why);
    }
  }

 private:
  MaybeTlsStream stream_;
  const RedisEndpoint ep_;
  // The connection's context (it outlives the watch: the connection
  // cancels the watch before it goes).
  const EngineTls* const tls_;
  const std::size_t index_;
  const std::chrono::milliseconds connect_timeout_;
  std::function<void(const SentinelAddress&)> on_switch_;
  bool cancelled_ = false;
};

}  // namespace

net::awaitable<Result<SentinelAddress>> ask_sentinels_for_master(
    net::any_io_executor ex, const RedisEndpoint& ep, const EngineTls* tls, std::size_t& preferred,
    std::chrono::milliseconds per_sentinel) {
  std::string errors;
  const std::size_t n = ep.sentinels.size();
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = (preferred + k) % n;
    auto r = co_await ask_one(ex, ep, tls, ep.sentinels[i], per_sentinel);
    if (r) {
      preferred = i;
      co_return r;
    }
    errors += (errors.empty() ? "" : "; ") + where(ep.sentinels[i]) + ": " + r.error();
  }
  co_return fail("no sentinel named master '" + ep.master_name + "' (" + errors + ")");
}

std::shared_ptr<SentinelWatch> watch_master_switch(
    net::any_io_executor ex, const RedisEndpoint& ep, const EngineTls* tls, std::size_t index,
    std::chrono::milliseconds connect_timeout,
    std::function<void(const SentinelAddress&)> on_switch) {
  auto w = std::make_shared<Watch>(ex, ep, tls, index, connect_timeout, std::move(on_switch));
  net::co_spawn(ex, Watch::run(w), net::detached);
  return w;
}

}  // namespace pdgate
