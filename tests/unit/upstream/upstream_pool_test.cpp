// The keep-alive pool and the exchange (core/upstream/upstream.*), against an
// engine played by a thread in this process: a pooled connection the
// engine closed while it sat idle is retried once on a fresh one (the
// request never started there), but a fresh connection that fails, or
// one that had begun to answer, is not; chunks that arrived together are
// read together; an engine that goes quiet is cut off at the first-byte
// timeout, before its header or between two events.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include "core/net/request_scope.hpp"
#include "core/upstream/upstream.hpp"

namespace pdgate {
namespace {

namespace net = boost::asio;
namespace http = boost::beast::http;

// What the fake engine does on each connection it accepts, in order.
enum class Plan {
  answer_then_close,      // answers one request with keep-alive, then closes
  answer_keep_open,       // answers every request, keep-alive
  close_unanswered,       // reads the request, closes without a byte
  answer_then_break,      // answers one request; to the next sends half a
                          // status line and closes
  chunked_burst,          // answers with three chunks and the last one, all in
                          // one send
  silent,                 // reads the request, never answers
  one_chunk_then_silent,  // a chunked header and one chunk, then nothing
};

// What chunked_burst sends: three SSE events in three chunks.
constexpr const char* kBurstEvents = "data: 1\n\ndata: 2\n\ndata: 3\n\n";

class FakeEngine {
 public:
  explicit FakeEngine(std::vector<Plan> plans) : plans_(std::move(plans)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeEngine() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::uint16_t port() const { return port_; }
  int connections() const { return connections_.load(); }
  int requests() const { return requests_.load(); }

 private:
  // Reads one request head (the tests send no body); false at EOF.
  bool read_request(int c) {
    std::string got;
    char buf[4096];
    while (got.find("\r\n\r\n") == std::string::npos) {
      auto n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0)
        return false;
      got.append(buf, static_cast<std::size_t>(n));
    }
    ++requests_;
    return true;
  }
  void answer(int c) {
    static const std::string ok =
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok";
    (void)::send(c, ok.data(), ok.size(), MSG_NOSIGNAL);
  }
  void serve() {
    for (Plan plan : plans_) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0)
        return;
      ++connections_;
      switch (plan) {
        case Plan::answer_then_close:
          if (read_request(c))
            answer(c);
          break;
        case Plan::answer_keep_open:
          while (read_request(c))
            answer(c);
          break;
        case Plan::close_unanswered:
          read_request(c);
          break;
        case Plan::answer_then_break:
          if (read_request(c))
            answer(c);
          if (read_request(c))
            (void)::send(c, "HTTP/1.1 2", 10, MSG_NOSIGNAL);
          break;
        case Plan::chunked_burst:
          if (read_request(c)) {
            static const std::string burst =
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                "Transfer-Encoding: chunked\r\n\r\n"
                "9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n9\r\ndata: 3\n\n\r\n0\r\n\r\n";
            (void)::send(c, burst.data(), burst.size(), MSG_NOSIGNAL);
            read_request(c);  // until the client closes
          }
          break;
        case Plan::silent:
          if (read_request(c))
            read_request(c);  // until the client gives up and closes
          break;
        case Plan::one_chunk_then_silent:
          if (read_request(c)) {
            static const std::string first =
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                "Transfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n";
            (void)::send(c, first.data(), first.size(), MSG_NOSIGNAL);
            read_request(c);
          }
          break;
      }
      ::close(c);
    }
  }

  std::vector<Plan> plans_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<int> connections_{0};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

struct Client {
  explicit Client(std::uint16_t port, Millis idle_timeout = std::chrono::seconds(30))
      : inst(std::make_shared<Instance>(
            1, *parse_upstream(Role::decode, "127.0.0.1:" + std::to_string(port)))),
        pool(io.get_executor(), inst, 8, idle_timeout) {}

  // Runs `body` (a coroutine taking the client) to its end.
  template <class Body>
  void run(Body body) {
    bool done = false;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
          co_await body();
          done = true;
        },
        net::detached);
    io.restart();
    io.run();
    EXPECT_TRUE(done);
  }

  // Starts a GET through the pool, `first_byte` its first-byte timeout.
  net::awaitable<std::pair<UpstreamError, std::unique_ptr<UpstreamExchange>>> start(
      RequestScope& scope, Millis first_byte) {
    http::request<http::string_body> req{http::verb::get, "/v1/models", 11};
    req.set(http::field::host, inst->host_port);
    req.keep_alive(true);
    co_return co_await UpstreamExchange::start(pool, req, scope,
                                               {std::chrono::seconds(2), first_byte});
  }

  // One GET through the pool: the error, and the body when it succeeded.
  std::pair<UpstreamError, std::string> exchange() {
    std::pair<UpstreamError, std::string> out;
    bool done = false;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
          http::request<http::string_body> req{http::verb::get, "/v1/models", 11};
          req.set(http::field::host, inst->host_port);
          req.keep_alive(true);
          RequestScope scope;
          auto [err, ex] = co_await UpstreamExchange::start(
              pool, req, scope, {std::chrono::seconds(2), std::chrono::seconds(2)});
          out.first = err;
          if (!err) {
            out.first = co_await ex->read_all(out.second, 1024);
            ex->finish();
          }
          done = true;
        },
        net::detached);
    io.restart();
    io.run();
    EXPECT_TRUE(done);
    return out;
  }

  net::io_context io;
  InstancePtr inst;
  UpstreamPool pool;
};

// The engine closed the idle keep-alive connection: the next request is
// sent again on a new connection, and the caller sees only the answer.
TEST(UpstreamPool, StaleKeepAliveIsRetriedOnAFreshConnection) {
  FakeEngine engine({Plan::answer_then_close, Plan::answer_keep_open});
  Client client(engine.port());
  auto [e1, b1] = client.exchange();
  ASSERT_FALSE(e1) << e1.detail;
  EXPECT_EQ(b1, "ok");
  EXPECT_EQ(client.pool.idle_count(), 1u);
  // Let the engine's close arrive, as it would after its idle timeout.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto [e2, b2] = client.exchange();
  ASSERT_FALSE(e2) << e2.detail;
  EXPECT_EQ(b2, "ok");
  EXPECT_EQ(engine.connections(), 2);
  EXPECT_EQ(engine.requests(), 2) << "the retried request reached the engine once";
  // The fresh connection went back to the pool and is reused as is.
  auto [e3, b3] = client.exchange();
  ASSERT_FALSE(e3) << e3.detail;
  EXPECT_EQ(engine.connections(), 2);
  EXPECT_EQ(engine.requests(), 3);
}

// A fresh connection closed before any answer is the engine's failure:
// reported as `closed`, never sent a second time.
TEST(UpstreamPool, FreshConnectionClosedIsNotRetried) {
  FakeEngine engine({Plan::close_unanswered, Plan::answer_keep_open});
  Client client(engine.port());
  auto [err, body] = client.exchange();
  EXPECT_EQ(err.kind, UpstreamFailure::closed) << err.detail;
  EXPECT_EQ(engine.connections(), 1);
  EXPECT_EQ(engine.requests(), 1);
}

// A reused connection that had begun to answer (half a status line) is
// not retried: the engine may have started the work.
TEST(UpstreamPool, ReusedConnectionThatBeganToAnswerIsNotRetried) {
  FakeEngine engine({Plan::answer_then_break, Plan::answer_keep_open});
  Client client(engine.port());
  ASSERT_FALSE(client.exchange().first);
  ASSERT_EQ(client.pool.idle_count(), 1u);
  auto [err, body] = client.exchange();
  EXPECT_TRUE(err.kind == UpstreamFailure::closed || err.kind == UpstreamFailure::protocol)
      << err.detail;
  EXPECT_EQ(engine.connections(), 1) << "sent again on a new connection";
  EXPECT_EQ(engine.requests(), 2);
}

// The engine refuses connections: `connect`, the request never reached
// it (so the pipeline may send it elsewhere for free).
TEST(UpstreamPool, RefusedIsAConnectFailure) {
  std::uint16_t port;
  {
    FakeEngine gone({});
    port = gone.port();
  }
  Client client(port);
  auto [err, body] = client.exchange();
  EXPECT_EQ(err.kind, UpstreamFailure::connect) << err.detail;
}

// Three chunks that arrived in one piece come out of one read_some, with
// the stream's end: a relay writes them to its client at once.
TEST(UpstreamExchange, ChunksThatArrivedTogetherAreReadTogether) {
  FakeEngine engine({Plan::chunked_burst});
  Client client(engine.port());
  std::string got;
  UpstreamError err;
  bool done_after_one_read = false;
  client.run([&]() -> net::awaitable<void> {
    RequestScope scope;
    auto [e, ex] = co_await client.start(scope, std::chrono::seconds(2));
    err = e;
    if (e)
      co_return;
    err = co_await ex->read_some(got);
    done_after_one_read = ex->done();
  });
  ASSERT_FALSE(err) << err.detail;
  EXPECT_EQ(got, kBurstEvents);
  EXPECT_TRUE(done_after_one_read) << "the last chunk was parsed with the others";
}

// An engine that never answers is cut off at the first-byte timeout (the
// exchange waits for its first byte without a read buffer).
TEST(UpstreamExchange, SilentEngineTimesOutBeforeItsHeader) {
  FakeEngine engine({Plan::silent});
  Client client(engine.port());
  UpstreamError err;
  const auto t0 = std::chrono::steady_clock::now();
  client.run([&]() -> net::awaitable<void> {
    RequestScope scope;
    auto [e, ex] = co_await client.start(scope, std::chrono::milliseconds(200));
    err = e;
  });
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(err.kind, UpstreamFailure::timeout) << err.detail;
  EXPECT_GE(took, std::chrono::milliseconds(190));
  EXPECT_LT(took, std::chrono::seconds(10));
}

// A stream whose engine goes quiet after its first event: the wait for
// the next bytes (wait_bytes, as a relay makes it) ends at the first-byte
// timeout with `timeout`.
TEST(UpstreamExchange, QuietStreamTimesOutBetweenEvents) {
  FakeEngine engine({Plan::one_chunk_then_silent});
  Client client(engine.port());
  std::string got;
  UpstreamError first, waited;
  bool had_to_wait = false;
  client.run([&]() -> net::awaitable<void> {
    RequestScope scope;
    auto [e, ex] = co_await client.start(scope, std::chrono::milliseconds(200));
    first = e;
    if (e)
      co_return;
    while (got.empty() && !first)
      first = co_await ex->read_some(got);
    had_to_wait = ex->must_wait();
    waited = co_await ex->wait_bytes();
  });
  ASSERT_FALSE(first) << first.detail;
  EXPECT_EQ(got, "data: 1\n\n");
  EXPECT_TRUE(had_to_wait);
  EXPECT_EQ(waited.kind, UpstreamFailure::timeout) << waited.detail;
}

// Idle connections older than the idle timeout are dropped by sweep()
// and never handed out.
TEST(UpstreamPool, OldIdleConnectionsAreDropped) {
  FakeEngine engine({Plan::answer_keep_open, Plan::answer_keep_open});
  Client client(engine.port(), std::chrono::milliseconds(100));
  ASSERT_FALSE(client.exchange().first);
  ASSERT_EQ(client.pool.idle_count(), 1u);
  client.pool.sweep();
  EXPECT_EQ(client.pool.idle_count(), 1u) << "dropped while fresh";
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  client.pool.sweep();
  EXPECT_EQ(client.pool.idle_count(), 0u);
  // The next request opens a new connection.
  ASSERT_FALSE(client.exchange().first);
  EXPECT_EQ(engine.connections(), 2);
}

}  // namespace
}  // namespace pdgate
