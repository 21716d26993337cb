// Watching a client's socket while its request is served, so that a client
// that leaves takes the request's upstream connections down with it (the
// engines abort and free their KV blocks).
//
// The watch starts only once the request has lasted a little while
// (between one and two ticks of kWatchDelay): most requests are answered
// sooner, and a watch costs a system call (Asio's speculative receive,
// which finds the socket empty), an operation and its cancellation. A
// request that ends first never pays for it; the engines of one that lasts
// are aborted at most two ticks later than an immediate watch would.
#pragma once

#include <chrono>
#include <memory>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/intrusive/list.hpp>

#include "core/net/request_scope.hpp"

namespace pdgate {

// How long a request runs before its client is watched (one tick; the
// watch starts between one and two ticks after the request was read).
inline constexpr std::chrono::milliseconds kWatchDelay{20};
// How often a client that pipelined bytes is checked for a hangup.
inline constexpr std::chrono::milliseconds kHangupPollInterval{50};

using WatchHook =
    boost::intrusive::list_member_hook<boost::intrusive::link_mode<boost::intrusive::auto_unlink>>;

// One client request's scope and whether it is over, in one allocation:
// a started watch may outlive the request.
struct WatchedRequest : std::enable_shared_from_this<WatchedRequest> {
  RequestScope scope;
  bool done = false;
  char peek = 0;  // the watch's receive buffer (it must outlive the wait)
  // While waiting for its watch to start: the worker's list and the tick
  // it joined at. Unlinked when the watch starts or the request ends.
  WatchHook hook;
  std::uint64_t joined_tick = 0;
  boost::asio::ip::tcp::socket* socket = nullptr;
  bool tls = false;
  // The connection's read buffer, empty while the request is served:
  // released when the watch starts, so that a request that lasts (a
  // stream, for minutes) does not hold it, while the many that are
  // answered sooner reuse it for the next request without a new
  // allocation. Null: nothing to release.
  boost::beast::flat_buffer* idle_buffer = nullptr;
  // Once the client has sent bytes past its request (they stay in the
  // socket for the next request, so a receive would find them at once),
  // the watch polls for the client's hangup instead, on this timer.
  std::unique_ptr<boost::asio::steady_timer> hangup_poll;
};

// One worker's requests waiting for their watch, oldest first. A timer
// ticks every kWatchDelay while any wait; each tick starts the watches of
// those that joined before the previous tick. Not thread-safe: one worker.
class ClientWatches {
 public:
  explicit ClientWatches(boost::asio::any_io_executor ex,
                         std::chrono::milliseconds delay = kWatchDelay);
  ClientWatches(const ClientWatches&) = delete;
  ClientWatches& operator=(const ClientWatches&) = delete;

  // Watches `socket` for `req` once the request has lasted `delay`. The
  // request ends with end(): its watch, started or not, is then over.
  // `read_buffer` is the connection's read buffer: released when the
  // watch starts if it is empty then, left alone when it holds bytes the
  // client sent past this request.
  void watch_later(const std::shared_ptr<WatchedRequest>& req, boost::asio::ip::tcp::socket& socket,
                   bool tls, boost::beast::flat_buffer* read_buffer = nullptr);
  static void end(WatchedRequest& req);

  // Requests whose watch has not started yet (for tests).
  std::size_t waiting() const { return waiting_.size(); }

 private:
  void arm();
  void tick();

  boost::intrusive::list<
      WatchedRequest,
      boost::intrusive::member_hook<WatchedRequest, WatchHook, &WatchedRequest::hook>,
      boost::intrusive::constant_time_size<false>>
      waiting_;
  boost::asio::steady_timer timer_;
  std::chrono::milliseconds delay_;
  std::uint64_t tick_ = 0;
  bool armed_ = false;
  // The timer's handler holds a weak reference: a tick already queued
  // when this object goes (a test's worker context) does nothing.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

// Starts watching at once. A client that sends nothing more is watched by
// a receive: readability means it closed the connection (or reset it).
// One that sent bytes past its request (a pipelined request, or stray
// bytes) is then checked every kHangupPollInterval for a hangup (the
// peer's FIN or a reset, which the kernel reports behind unread bytes);
// its bytes stay in the socket for the next request.
void watch_client(const std::shared_ptr<WatchedRequest>& req);

}  // namespace pdgate
