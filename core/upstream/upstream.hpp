// Keep-alive connection pools to engine instances and one HTTP/1.1
// exchange over them. A pool belongs to one worker thread (no locks); each
// worker has its own pool per instance.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "core/net/body_budget.hpp"
#include "core/net/engine_response_parser.hpp"
#include "core/net/maybe_tls_stream.hpp"
#include "core/net/request_scope.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Millis = std::chrono::milliseconds;

struct UpstreamTimeouts {
  Millis connect{5'000};
  Millis first_byte{600'000};
};

// How an exchange with an engine failed. `connect`, `connect_timeout`: the
// request never reached the engine (resolve, refused, no answer to the
// connect), so sending it
// elsewhere is always safe. `local`: the gateway itself is short of a
// resource (file descriptors, memory): not the engine's fault. `ejected`:
// the engine was ejected while the request waited for it.
enum class UpstreamFailure {
  none,
  connect,
  connect_timeout,
  timeout,
  closed,
  protocol,
  aborted,
  too_large,
  local,
  ejected,
  // The answer memory budget (--answer-memory-limit) cannot take a whole
  // answer's next bytes: the gateway's shortage, not the engine's fault.
  over_budget
};

// Whether a socket error means the gateway ran out of something (EMFILE,
// ENFILE, ENOBUFS, ENOMEM) rather than that the peer failed.
bool is_local_resource_error(const boost::system::error_code& ec);

// Connects `stream` to the first of `endpoints` that accepts, within the
// stream's current expiry. Each socket is opened here, not inside Asio's
// range connect (which reports a failed open as "operation canceled"), so
// that the gateway's own shortage of descriptors (is_local_resource_error)
// is told apart from an engine that refuses.
// Resolves host:port with Asio (on its resolver thread, never blocking the
// loop), given up at `deadline` (operation_aborted). The deadline's timer
// holds no reference to this coroutine's frame: a timer that fires as the
// resolve completes must not touch a resolver that is gone.
boost::asio::awaitable<
    std::pair<boost::system::error_code, boost::asio::ip::tcp::resolver::results_type>>
resolve_until(boost::asio::any_io_executor ex, const std::string& host, std::uint16_t port,
              std::chrono::steady_clock::time_point deadline);

boost::asio::awaitable<boost::system::error_code> connect_stream(
    DeadlineSocket& stream, const boost::asio::ip::tcp::resolver::results_type& endpoints);

struct UpstreamError {
  UpstreamFailure kind = UpstreamFailure::none;
  std::string detail;  // human-readable, names the cause ("connection refused")
  explicit operator bool() const { return kind != UpstreamFailure::none; }
};

// The room a read from an engine gets: a whole non-streaming completion or
// prefill answer for a short prompt, header included, or a burst of
// stream events, fits in one read. It is allocated only once bytes are
// there to read (UpstreamExchange waits for them without a buffer).
inline constexpr std::size_t kFirstRead = 4096;
// A whole answer up to this size is not charged to the answer budget (as
// a client body that comes with its header is not): the common small
// answer pays no atomic operation.
inline constexpr std::size_t kUnchargedAnswer = 64 * 1024;

struct UpstreamConnection {
  explicit UpstreamConnection(const net::any_io_executor& ex) : stream(ex) {}
  // TLS for an https:// engine; a pooled TLS connection is reused as a
  // plain one is, its session already established.
  MaybeTlsStream stream;
  // Bounded: engine response headers are small, and body bytes pass
  // through it on their way to the relay.
  beast::flat_buffer buffer{64 * 1024};
  // The last read emptied the socket: the next one waits for bytes first.
  bool drained = true;
  std::chrono::steady_clock::time_point idle_since{};
  bool reused = false;
};

class UpstreamExchange;
struct EngineTls;

class UpstreamPool {
 public:
  // `tls` secures https:// instances (null: they cannot be reached).
  // `answer_budget` is charged for whole answers read (null: no bound).
  UpstreamPool(net::any_io_executor ex, InstancePtr instance, std::size_t max_idle,
               Millis idle_timeout, const EngineTls* tls = nullptr,
               BodyBudget* answer_budget = nullptr);

  const InstancePtr& instance() const { return instance_; }
  BodyBudget* answer_budget() const { return answer_budget_; }

  // An idle keep-alive connection, or nullptr.
  std::unique_ptr<UpstreamConnection> take_idle();
  // Returns a connection whose last response completed cleanly.
  void give_back(std::unique_ptr<UpstreamConnection> c);
  // Opens a new connection (async DNS, bounded connect time).
  net::awaitable<std::pair<UpstreamError, std::unique_ptr<UpstreamConnection>>> connect(
      Millis timeout, RequestScope* scope);
  // Drops idle connections older than the idle timeout.
  void sweep();
  std::size_t idle_count() const { return idle_.size(); }

  // Exchanges on this instance whose client has received nothing yet:
  // when the instance is ejected they are cut off at once (they fail over
  // or fail) instead of waiting out the first-byte timeout.
  void add_waiting(UpstreamExchange* ex) { waiting_.push_back(ex); }
  void remove_waiting(UpstreamExchange* ex) { std::erase(waiting_, ex); }
  void abort_waiting();
  // Exchanges alive on this pool: they refer to it, so it must outlive them.
  std::size_t live = 0;

 private:
  net::any_io_executor ex_;
  InstancePtr instance_;
  std::size_t max_idle_;
  Millis idle_timeout_;
  const EngineTls* tls_;
  BodyBudget* answer_budget_;
  std::deque<std::unique_ptr<UpstreamConnection>> idle_;
  std::optional<tcp::resolver::results_type> resolved_;
  std::chrono::steady_clock::time_point resolved_at_{};
  std::vector<UpstreamExchange*> waiting_;
};

// The pools of one worker, created on first use.
class UpstreamPools {
 public:
  UpstreamPools(net::any_io_executor ex, std::size_t max_idle, Millis idle_timeout)
      : ex_(std::move(ex)), max_idle_(max_idle), idle_timeout_(idle_timeout) {}
  UpstreamPool& for_instance(const InstancePtr& inst);
  void sweep();
  // Drops the pools of instances no longer in `set` (removed at run time).
  void retain(const InstanceSet& set);
  // The instance was ejected: see UpstreamPool::abort_waiting.
  void abort_waiting(std::uint64_t instance_id);
  // How https:// instances are reached (set once, before the first use).
  void set_tls(std::shared_ptr<const EngineTls> tls) { tls_ = std::move(tls); }
  // What whole answers read are charged to (set once, before the first
  // use; shared by every worker).
  void set_answer_budget(BodyBudget* budget) { answer_budget_ = budget; }

 private:
  net::any_io_executor ex_;
  std::size_t max_idle_;
  Millis idle_timeout_;
  std::shared_ptr<const EngineTls> tls_;
  BodyBudget* answer_budget_ = nullptr;
  std::unordered_map<std::uint64_t, std::unique_ptr<UpstreamPool>> pools_;
};

// One request/response on a pooled connection: send, read the header, then
// read the body in pieces. Destroying it before the body is complete closes
// the connection (the engine sees the request aborted).
class UpstreamExchange {
 public:
  ~UpstreamExchange();
  UpstreamExchange(const UpstreamExchange&) = delete;
  UpstreamExchange& operator=(const UpstreamExchange&) = delete;

  // Sends `req` and waits for the response header (bounded by the
  // first-byte timeout). A reused keep-alive connection that turns out to
  // be closed before any response byte is retried once on a new one.
  static net::awaitable<std::pair<UpstreamError, std::unique_ptr<UpstreamExchange>>> start(
      UpstreamPool& pool, http::request<http::string_body>& req, RequestScope& scope,
      UpstreamTimeouts timeouts);
  // The same with the request's head already rendered (request line,
  // fields, empty line: core/pipeline/engine_call.hpp upstream_head) and the body given as
  // a buffer sequence (slices of the client's body and edited fragments,
  // core/base/json_body.hpp), written in one gathering write: a large body is
  // never copied. `head` must carry the body's Content-Length; its bytes
  // and the buffers' must stay valid until this completes.
  static net::awaitable<std::pair<UpstreamError, std::unique_ptr<UpstreamExchange>>> start(
      UpstreamPool& pool, std::string_view head, const std::vector<net::const_buffer>& body,
      RequestScope& scope, UpstreamTimeouts timeouts);

  unsigned status() const { return parser_.status(); }
  // The answer's Content-Type and Cache-Control (empty when not sent).
  const std::string& content_type() const { return parser_.content_type(); }
  const std::string& cache_control() const { return parser_.cache_control(); }
  bool done() const { return parser_.is_done(); }
  // Frees the response's header fields once they have been copied (a relay
  // that lasts minutes does not keep them); status() stays valid.
  void drop_header_fields() { parser_.drop_header_values(); }

  // Appends whatever body bytes are available now to `out`, up to `max`
  // bytes: all the events of a stream that arrived together, however many
  // chunks they came in. Waits for bytes only when none are buffered;
  // may append nothing (a read that ended inside a chunk's framing).
  net::awaitable<UpstreamError> read_some(std::string& out, std::size_t max = kFirstRead);
  // What read_some does when bytes are buffered, without its coroutine
  // frame: appends the body bytes the buffer holds. `wanted` when that
  // needs a read (nothing usable buffered): then read_some.
  UpstreamError take_buffered(std::string& out, std::size_t max, bool& wanted);
  // Whether the next read must wait for the engine (nothing usable
  // buffered, the socket emptied by the last read, a plain connection). A relay waits
  // with wait_bytes() itself, so that an idle stream's wait is not nested
  // inside the frames of a read.
  bool must_wait() const;
  // Waits for bytes without a read buffer (its room is released first),
  // bounded by the first-byte timeout; a failure is told as read_some
  // would tell it.
  net::awaitable<UpstreamError> wait_bytes();

  // Reads the rest of the body into `out`, failing past `limit` bytes.
  // Past the first kUnchargedAnswer bytes, `out`'s memory is charged to
  // the pool's answer budget before it grows (over_budget when the budget
  // cannot take it), and held until the exchange is destroyed.
  net::awaitable<UpstreamError> read_all(std::string& out, std::size_t limit);
  // The same without a coroutine frame when the buffer holds the rest of
  // the body (a small answer comes with its header): nullopt, and `err`
  // tells how it ended. Otherwise the read_all that reads the rest.
  //
  //   UpstreamError err;
  //   if (auto rest = ex->read_all(out, limit, err))
  //     err = co_await std::move(*rest);
  std::optional<net::awaitable<UpstreamError>> read_all(std::string& out, std::size_t limit,
                                                        UpstreamError& err);
  // Between a stream's events: gives back the connection buffer's free
  // room, so a stream idling for minutes holds none (the next read
  // allocates it once bytes are there).
  void release_idle_memory();

  // Hands the connection back to the pool when the response completed and
  // the engine allows keep-alive; closes it otherwise.
  void finish();

  // The client has received bytes of this answer: from now on the
  // exchange is not cut off when its instance is ejected (a retry is no
  // longer possible; the stream runs its course or breaks).
  void committed();
  // Called by the pool when the instance is ejected while waiting.
  void abort_ejected();

 private:
  UpstreamExchange(UpstreamPool& pool, std::unique_ptr<UpstreamConnection> conn,
                   RequestScope& scope, UpstreamTimeouts timeouts);
  UpstreamError classify(const beast::error_code& ec, const char* during) const;
  // The wait for bytes on a plain connection, bounded by the first-byte
  // timeout (see fill), and its outcome.
  net::awaitable<std::tuple<beast::error_code>> readable_or_timeout();
  beast::error_code after_wait(const std::tuple<beast::error_code>& r);
  // Reads what the engine sent into the connection's buffer, at most
  // `room` bytes; on a plain connection it first waits for bytes without
  // a buffer (bounded by the first-byte timeout). net::error::eof at the
  // connection's end.
  net::awaitable<beast::error_code> fill(std::size_t room);
  // Parses the buffered bytes into `out` (at most `max` more bytes of
  // body). `wanted`: the parser needs bytes the buffer does not hold (it
  // gave none); then the caller reads and calls again.
  UpstreamError parse_into(std::string& out, std::size_t max, bool& wanted);
  UpstreamError over_limit(std::size_t limit) const;
  // Makes room in `out` for `want` bytes, the growth charged first to the
  // answer budget when read_all reads (false: the budget refused it).
  bool reserve_charged(std::string& out, std::size_t want);
  // The read of a header's bytes on a plain connection that the last read
  // emptied (see fill), in two halves so that start() awaits it without
  // fill's frame.
  bool reads_header_directly() const;
  net::awaitable<std::tuple<beast::error_code, std::size_t>> header_read(std::size_t room);
  beast::error_code after_header_read(const std::tuple<beast::error_code, std::size_t>& r,
                                      std::size_t room);
  // Feeds the buffered bytes to the parser (into the body buffer it was
  // given); returns the parser's verdict (need_more: it wants more bytes).
  beast::error_code parse_buffered();

  UpstreamPool& pool_;
  std::unique_ptr<UpstreamConnection> conn_;
  RequestScope& scope_;
  UpstreamTimeouts timeouts_;
  EngineResponseParser parser_;
  bool needs_more_ = false;  // the parser wants bytes the buffer does not hold
  bool waiting_ = true;      // registered with the pool (see committed())
  bool ejected_ = false;     // cut off by abort_ejected()
  bool whole_ = false;       // read_all reads: its growth is charged
  // What `out` of read_all holds of the answer budget.
  std::size_t charged_ = 0;
};

}  // namespace pdgate
