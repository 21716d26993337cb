// A TCP socket whose operations end at an expiry, as those of Beast's
// tcp_stream do, without a timer of its own.
//
// tcp_stream keeps three timers in a shared state it allocates per
// connection (~540 bytes), and starts and cancels a timer for every read
// or write that has an expiry. A gateway holding 10,000 streams holds two
// connections per stream, and a request makes several timed reads. Here
// the expiries of an event loop's sockets are kept by one `Deadlines`
// service per execution context, in order, with one timer for the earliest;
// a socket carries the service's hook and its expiry (~40 bytes), and a
// timed operation links it in and out of the service's order.
//
// The semantics are tcp_stream's: the expiry bounds the operations that
// are pending or started while it is set; when it passes, the socket is
// closed and they complete with beast::error::timeout (an operation started
// after it passed fails so at once). An expiry that passes while no
// operation is pending does nothing until the next one starts.
//
// Not thread-safe: a socket and its context's service are used from the
// one thread that runs the context, as every event loop of pdgate is. A
// socket must outlive its pending operations (the coroutine that awaits
// one holds the socket).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include <boost/asio/compose.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/bind_handler.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/intrusive/set.hpp>

namespace pdgate {

class Deadlines;

class DeadlineSocket : public boost::intrusive::set_base_hook<
                           boost::intrusive::link_mode<boost::intrusive::safe_link>,
                           boost::intrusive::optimize_size<true>> {
 public:
  using clock = std::chrono::steady_clock;
  using executor_type = boost::asio::any_io_executor;
  using socket_type = boost::asio::ip::tcp::socket;
  // For the TLS layer (asio::ssl::stream) stacked on it.
  using lowest_layer_type = socket_type;

  explicit DeadlineSocket(socket_type socket);
  explicit DeadlineSocket(const executor_type& ex);
  ~DeadlineSocket();
  // The service links the object itself: it never moves.
  DeadlineSocket(const DeadlineSocket&) = delete;
  DeadlineSocket& operator=(const DeadlineSocket&) = delete;

  executor_type get_executor() noexcept { return socket_.get_executor(); }
  socket_type& socket() { return socket_; }
  const socket_type& socket() const { return socket_; }
  lowest_layer_type& lowest_layer() { return socket_; }
  const lowest_layer_type& lowest_layer() const { return socket_; }

  template <class Rep, class Period>
  void expires_after(std::chrono::duration<Rep, Period> d) {
    expires_at(clock::now() + std::chrono::duration_cast<clock::duration>(d));
  }
  void expires_at(clock::time_point t);
  void expires_never();
  // Closes the socket: pending operations complete with operation_aborted.
  void close();

  template <class MutableBufferSequence, class Token>
  auto async_read_some(const MutableBufferSequence& buffers, Token&& token) {
    return boost::asio::async_compose<Token, void(boost::beast::error_code, std::size_t)>(
        TransferOp<MutableBufferSequence, true>{*this, buffers}, token, socket_);
  }

  template <class ConstBufferSequence, class Token>
  auto async_write_some(const ConstBufferSequence& buffers, Token&& token) {
    return boost::asio::async_compose<Token, void(boost::beast::error_code, std::size_t)>(
        TransferOp<ConstBufferSequence, false>{*this, buffers}, token, socket_);
  }

  // Connects an open socket (or opens it for the endpoint's protocol).
  template <class Token>
  auto async_connect(const boost::asio::ip::tcp::endpoint& peer, Token&& token) {
    return boost::asio::async_compose<Token, void(boost::beast::error_code)>(
        SignalOp{*this, [peer](socket_type& s, auto&& h) { s.async_connect(peer, std::move(h)); }},
        token, socket_);
  }

  // Waits until the socket is readable (bytes, its end, or an error),
  // reading nothing: no buffer is needed meanwhile.
  template <class Token>
  auto async_wait_readable(Token&& token) {
    return boost::asio::async_compose<Token, void(boost::beast::error_code)>(
        SignalOp{*this, [](socket_type& s,
                           auto&& h) { s.async_wait(socket_type::wait_read, std::move(h)); }},
        token, socket_);
  }

 private:
  friend class Deadlines;

  // Counts an operation in; false when the expiry has passed already (the
  // socket is closed then, and the operation must fail with timeout: it is
  // still counted out by end_op).
  bool begin_op();
  // Counts it out; the error it completes with: timeout when the expiry
  // closed the socket under it, whatever the socket reported.
  boost::beast::error_code end_op(boost::beast::error_code ec);
  // The service's call when the expiry passes with operations pending.
  void expire();

  template <class Buffers, bool IsRead>
  struct TransferOp {
    DeadlineSocket& s;
    Buffers buffers;
    bool started = false;

    template <class Self>
    void operator()(Self& self, boost::beast::error_code ec = {}, std::size_t n = 0) {
      if (!started) {
        started = true;
        if (!s.begin_op()) {
          boost::asio::post(s.socket_.get_executor(),
                            boost::beast::bind_front_handler(
                                std::move(self), boost::beast::error_code{}, std::size_t{0}));
          return;
        }
        if constexpr (IsRead)
          s.socket_.async_read_some(buffers, std::move(self));
        else
          s.socket_.async_write_some(buffers, std::move(self));
        return;
      }
      self.complete(s.end_op(ec), n);
    }
  };

  // An operation that completes with an error code alone; `start` begins
  // it on the socket.
  template <class Start>
  struct SignalOp {
    DeadlineSocket& s;
    Start start;
    bool started = false;

    template <class Self>
    void operator()(Self& self, boost::beast::error_code ec = {}) {
      if (!started) {
        started = true;
        if (!s.begin_op()) {
          // Not on the closed socket: a connect would open it again.
          boost::asio::post(
              s.socket_.get_executor(),
              boost::beast::bind_front_handler(std::move(self), boost::beast::error_code{}));
          return;
        }
        start(s.socket_, std::move(self));
        return;
      }
      self.complete(s.end_op(ec));
    }
  };

  socket_type socket_;
  Deadlines& deadlines_;
  clock::time_point expiry_ = clock::time_point::max();
  std::uint16_t pending_ = 0;
  // The expiry closed the socket under the pending operations.
  bool timed_out_ = false;
};

// The expiries of one execution context's sockets that have operations
// pending, earliest first, and one timer for the earliest. An Asio
// service: one per context, made on first use, gone with the context.
class Deadlines : public boost::asio::execution_context::service {
 public:
  using key_type = Deadlines;
  static inline boost::asio::execution_context::id id;

  explicit Deadlines(boost::asio::execution_context& ctx) : service(ctx) {}

  // The service of the context `ex` runs on.
  static Deadlines& of(const boost::asio::any_io_executor& ex);

  // Sockets whose expiry is being watched now.
  std::size_t watched() const { return order_.size(); }

 private:
  friend class DeadlineSocket;

  struct Earlier {
    bool operator()(const DeadlineSocket& a, const DeadlineSocket& b) const {
      return a.expiry_ < b.expiry_;
    }
  };
  using Order = boost::intrusive::multiset<DeadlineSocket, boost::intrusive::compare<Earlier>,
                                           boost::intrusive::constant_time_size<true>>;

  void watch(DeadlineSocket& s);
  void forget(DeadlineSocket& s);
  void wait_until(DeadlineSocket::clock::time_point t, const boost::asio::any_io_executor& ex);
  void on_timer();
  void shutdown() override;

  Order order_;
  // Made with the first socket's executor (a service knows its context,
  // not an executor for it).
  std::optional<boost::asio::steady_timer> timer_;
  // When the timer's pending wait ends; max when none is pending.
  DeadlineSocket::clock::time_point timer_at_ = DeadlineSocket::clock::time_point::max();
  bool shut_down_ = false;
};

}  // namespace pdgate
