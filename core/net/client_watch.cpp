#include "core/net/client_watch.hpp"

#include <poll.h>

#include <boost/asio/bind_cancellation_slot.hpp>

namespace pdgate {

namespace {

// Over TLS the peeked byte is a record's content type: an alert (a
// close_notify, or a fatal alert) means the client is leaving; application
// data is a pipelined request.
constexpr char kTlsAlert = 0x15;

// Whether the peer has hung up (sent its FIN, or reset the connection),
// whatever unread bytes come before that in the socket. A zero-timeout
// poll: it never blocks.
bool peer_hung_up(boost::asio::ip::tcp::socket& socket) {
  pollfd p{socket.native_handle(), POLLRDHUP, 0};
  if (::poll(&p, 1, 0) != 1)
    return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void poll_for_hangup(const std::shared_ptr<WatchedRequest>& req) {
  if (!req->hangup_poll)
    req->hangup_poll = std::make_unique<boost::asio::steady_timer>(req->socket->get_executor());
  req->hangup_poll->expires_after(kHangupPollInterval);
  auto slot = req->scope.watch_cancel().slot();
  req->hangup_poll->async_wait(
      boost::asio::bind_cancellation_slot(slot, [req](const boost::system::error_code& ec) {
        if (req->done || ec)
          return;
        if (peer_hung_up(*req->socket))
          req->scope.on_client_gone();
        else
          poll_for_hangup(req);
      }));
}

}  // namespace

// The watch is a 1-byte MSG_PEEK receive rather than an async_wait: Asio
// queues a wait with an epoll_ctl that re-arms the descriptor, while a
// receive costs one speculative recv. Peeked bytes stay in the socket for
// the next read.
void watch_client(const std::shared_ptr<WatchedRequest>& req) {
  auto slot = req->scope.watch_cancel().slot();
  req->socket->async_receive(boost::asio::buffer(&req->peek, 1),
                             boost::asio::ip::tcp::socket::message_peek,
                             boost::asio::bind_cancellation_slot(
                                 slot, [req](const boost::system::error_code& ec, std::size_t n) {
                                   // `done` is checked first: once the request completed, the
                                   // session may already have moved on.
                                   if (req->done || ec == boost::asio::error::operation_aborted)
                                     return;
                                   if (!ec && n > 0 && !(req->tls && req->peek == kTlsAlert)) {
                                     // Bytes past the request: they stay for the next
                                     // request, and the watch goes on by polling.
                                     poll_for_hangup(req);
                                     return;
                                   }
                                   req->scope.on_client_gone();  // end of stream or a reset
                                 }));
}

ClientWatches::ClientWatches(boost::asio::any_io_executor ex, std::chrono::milliseconds delay)
    : timer_(std::move(ex)), delay_(delay) {}

void ClientWatches::watch_later(const std::shared_ptr<WatchedRequest>& req,
                                boost::asio::ip::tcp::socket& socket, bool tls,
                                boost::beast::flat_buffer* read_buffer) {
  req->socket = &socket;
  req->tls = tls;
  req->idle_buffer = read_buffer;
  req->joined_tick = tick_;
  waiting_.push_back(*req);
  if (!armed_)
    arm();
}

void ClientWatches::end(WatchedRequest& req) {
  req.done = true;
  req.idle_buffer = nullptr;
  req.hook.unlink();
  req.scope.watch_cancel().emit(boost::asio::cancellation_type::all);
}

void ClientWatches::arm() {
  armed_ = true;
  timer_.expires_after(delay_);
  timer_.async_wait(
      [this, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
        if (ec || alive.expired())
          return;
        armed_ = false;
        tick();
      });
}

void ClientWatches::tick() {
  // Those that joined before the previous tick have lasted at least one
  // delay; the younger ones wait for the next tick.
  while (!waiting_.empty() && waiting_.front().joined_tick < tick_) {
    WatchedRequest& req = waiting_.front();
    waiting_.pop_front();
    if (req.idle_buffer != nullptr && req.idle_buffer->size() == 0)
      req.idle_buffer->shrink_to_fit();
    req.idle_buffer = nullptr;
    watch_client(req.shared_from_this());
  }
  ++tick_;
  if (!waiting_.empty())
    arm();
}

}  // namespace pdgate
