// One connection that is plain TCP or TLS over TCP, decided when it is set
// up: clients on a --tls-cert listener, engines at https:// URLs. It models
// Asio's AsyncReadStream and AsyncWriteStream, so Beast's http::async_read
// and async_write, and Asio's composed operations, run on it unchanged; the
// timeout, close and socket calls go to the TCP layer underneath either way
// (a DeadlineSocket: core/net/deadline_socket.hpp).
//
// A plain connection pays one branch per read or write: the TLS layer is
// only allocated (and OpenSSL only entered) when start_tls() is called.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_suffix.hpp>
#include <boost/beast/core/error.hpp>

#include "core/net/deadline_socket.hpp"

namespace pdgate {

class MaybeTlsStream {
 public:
  using tcp_type = DeadlineSocket;
  using tls_type = boost::asio::ssl::stream<tcp_type&>;
  using executor_type = tcp_type::executor_type;

  explicit MaybeTlsStream(boost::asio::ip::tcp::socket socket) : tcp_(std::move(socket)) {}
  explicit MaybeTlsStream(const executor_type& ex) : tcp_(ex) {}
  // The TLS layer refers to tcp_: the object never moves.
  MaybeTlsStream(const MaybeTlsStream&) = delete;
  MaybeTlsStream& operator=(const MaybeTlsStream&) = delete;

  executor_type get_executor() noexcept { return tcp_.get_executor(); }

  // From now on reads and writes go through TLS (the handshake is the
  // caller's: tls().async_handshake).
  tls_type& start_tls(boost::asio::ssl::context& ctx) {
    tls_ = std::make_unique<tls_type>(tcp_, ctx);
    return *tls_;
  }
  bool is_tls() const { return tls_ != nullptr; }
  tls_type& tls() { return *tls_; }

  tcp_type& tcp() { return tcp_; }
  boost::asio::ip::tcp::socket& socket() { return tcp_.socket(); }
  const boost::asio::ip::tcp::socket& socket() const { return tcp_.socket(); }
  // The peer's address as accept() returned it, as text (an IPv4-mapped
  // IPv6 address as IPv4), set once per connection: asking the socket
  // (getpeername) and formatting it (inet_ntop) cost a system call and
  // ~1,700 instructions per request.
  void set_peer(const boost::asio::ip::tcp::endpoint& peer) {
    auto addr = peer.address();
    if (addr.is_v6() && addr.to_v6().is_v4_mapped())
      addr = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, addr.to_v6());
    peer_address_ = addr.to_string();
    peer_v6_ = addr.is_v6();
  }
  // Empty when not set.
  const std::string& peer_address() const { return peer_address_; }
  bool peer_is_v6() const { return peer_v6_; }
  template <class Duration>
  void expires_after(Duration d) {
    tcp_.expires_after(d);
  }
  void expires_at(std::chrono::steady_clock::time_point t) { tcp_.expires_at(t); }
  void expires_never() { tcp_.expires_never(); }
  void close() { tcp_.close(); }

  // Writes what of `buffers` the socket takes now, and returns the write
  // of the rest to be awaited, if any. A plain connection's kernel buffer
  // usually takes a whole answer at once, so the write is tried here
  // first, as a non-blocking gathering send: no asynchronous operation,
  // handler, timer or coroutine frame for it. What the socket does not
  // take (a slow client, a large body), and everything over TLS, is
  // written asynchronously, within the expiry, by the returned awaitable
  // (it holds its own copy of the buffer sequence; the bytes must outlive
  // it). Nullopt when nothing is left: all was sent, or `ec` says why not.
  //
  //   beast::error_code ec;
  //   if (auto rest = stream.write(buffers, ec))
  //     ec = co_await std::move(*rest);
  template <class ConstBufferSequence>
  std::optional<boost::asio::awaitable<boost::beast::error_code>> write(
      const ConstBufferSequence& buffers, boost::beast::error_code& ec) {
    ec = {};
    std::size_t sent = 0;
    if (!tls_) {
      if (make_non_blocking(ec))
        sent = tcp_.socket().write_some(buffers, ec);
      if (!ec && sent == boost::asio::buffer_size(buffers))
        return std::nullopt;
      if (ec && ec != boost::asio::error::would_block)
        return std::nullopt;
      ec = {};
    }
    return write_rest(buffers, sent);
  }

  // What a plain connection's socket holds now, read without waiting
  // (would_block when it holds nothing; eof at its end): the caller waited
  // for readiness itself, with no buffer allocated meanwhile. Not for TLS,
  // whose bytes may wait inside the TLS layer.
  template <class MutableBufferSequence>
  std::size_t read_now(const MutableBufferSequence& buffers, boost::beast::error_code& ec) {
    return make_non_blocking(ec) ? tcp_.socket().read_some(buffers, ec) : 0;
  }

  template <class MutableBufferSequence, class Token>
  auto async_read_some(const MutableBufferSequence& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::beast::error_code, std::size_t)>(
        [](auto handler, MaybeTlsStream* self, const MutableBufferSequence& b) {
          if (self->tls_)
            self->tls_->async_read_some(b, std::move(handler));
          else
            self->tcp_.async_read_some(b, std::move(handler));
        },
        token, this, buffers);
  }

  template <class ConstBufferSequence, class Token>
  auto async_write_some(const ConstBufferSequence& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::beast::error_code, std::size_t)>(
        [](auto handler, MaybeTlsStream* self, const ConstBufferSequence& b) {
          if (!self->tls_) {
            self->tcp_.async_write_some(b, std::move(handler));
          } else if (const std::size_t n = self->coalesce(b); n != 0) {
            self->tls_->async_write_some(boost::asio::buffer(self->out_.data(), n),
                                         std::move(handler));
          } else {
            self->tls_->async_write_some(b, std::move(handler));
          }
        },
        token, this, buffers);
  }

 private:
  // The immediate reads and writes above need the socket in non-blocking
  // mode (Asio's own operations do not); set once per connection.
  bool make_non_blocking(boost::beast::error_code& ec) {
    auto& s = tcp_.socket();
    if (!s.non_blocking())
      s.non_blocking(true, ec);
    return !ec;
  }

  // The rest of a write() that the socket did not take at once.
  template <class ConstBufferSequence>
  boost::asio::awaitable<boost::beast::error_code> write_rest(ConstBufferSequence buffers,
                                                              std::size_t sent) {
    boost::beast::buffers_suffix<ConstBufferSequence> rest(buffers);
    rest.consume(sent);
    auto [ec, n] = co_await boost::asio::async_write(
        *this, rest, boost::asio::as_tuple(boost::asio::use_awaitable));
    co_return ec;
  }

  // One TLS record's worth of plaintext.
  static constexpr std::size_t kRecord = 16 * 1024;

  // Asio's TLS stream writes only the first buffer of a sequence per
  // call: a gathering write (a chunk's size line, its data and CRLF) would
  // leave as one TLS record per piece, each with its own header, MAC and
  // system call. The leading buffers that fit in one record are copied
  // into out_ instead; returns their size (0: pass the sequence through).
  // One write is in flight at a time, so one out_ serves them all; it is
  // shrunk when it grew for a large write and a small one follows, so a
  // stream idling between events does not keep it.
  template <class ConstBufferSequence>
  std::size_t coalesce(const ConstBufferSequence& b) {
    std::size_t total = 0;
    int count = 0;
    for (auto it = boost::asio::buffer_sequence_begin(b); it != boost::asio::buffer_sequence_end(b);
         ++it) {
      const std::size_t n = boost::asio::const_buffer(*it).size();
      if (total + n > kRecord)
        break;
      total += n;
      ++count;
    }
    if (count < 2)
      return 0;
    if (out_.capacity() > 4 * total && out_.capacity() > 4096)
      std::string().swap(out_);
    out_.resize(total);
    boost::asio::buffer_copy(boost::asio::buffer(out_.data(), total), b, total);
    return total;
  }

  tcp_type tcp_;
  // A pointer, not an optional: a plain connection (a held stream has two)
  // does not carry the TLS layer's ~360 bytes.
  std::unique_ptr<tls_type> tls_;
  std::string peer_address_;
  bool peer_v6_ = false;
  std::string out_;
};

}  // namespace pdgate
