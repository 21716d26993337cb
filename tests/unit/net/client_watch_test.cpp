// The client watch (core/net/client_watch.*): a request is watched only once
// it has lasted a tick, so one answered sooner costs no watch at all; a
// request that lasts notices its client leaving (before or after its watch
// started), and bytes a client pipelines are not taken for a close.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include "core/net/client_watch.hpp"
#include "tests/unit/loopback_pair.hpp"

namespace pdgate {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

constexpr auto kTick = 10ms;

using Pair = test::LoopbackPair;

// A worker's watches, one client connection and one request on it.
class ClientWatchesTest : public ::testing::Test {
 protected:
  // Runs the loop until `done()`, at most 2 s: a loaded machine (the
  // sanitizer suite runs two tests at once) can run a tick's timer well
  // after the tick, so a fixed run_for(3 * kTick) sometimes ended first.
  template <typename Done>
  bool run_until(Done done) {
    const auto start = std::chrono::steady_clock::now();
    while (!done() && std::chrono::steady_clock::now() - start < 2s)
      ioc.run_for(1ms);
    return done();
  }
  // Runs the loop until the request knows its client left, at most 2 s.
  bool wait_gone() {
    return run_until([this] { return req->scope.client_gone(); });
  }

  net::io_context ioc;
  Pair p{ioc};
  ClientWatches watches{ioc.get_executor(), kTick};
  std::shared_ptr<WatchedRequest> req = std::make_shared<WatchedRequest>();
};

TEST_F(ClientWatchesTest, RequestEndedBeforeItsTickIsNeverWatched) {
  watches.watch_later(req, p.server, false);
  EXPECT_EQ(watches.waiting(), 1u);
  ClientWatches::end(*req);
  EXPECT_EQ(watches.waiting(), 0u);
  // The client leaves afterwards: no watch was started, nothing notices.
  p.client.close();
  ioc.run_for(5 * kTick);
  EXPECT_FALSE(req->scope.client_gone());
  // Only `req` itself holds it: no receive was ever queued with it.
  EXPECT_EQ(req.use_count(), 1);
}

TEST_F(ClientWatchesTest, LastingRequestNoticesTheClientLeaving) {
  watches.watch_later(req, p.server, false);
  EXPECT_TRUE(run_until([this] { return watches.waiting() == 0; }));  // its watch has started
  EXPECT_FALSE(req->scope.client_gone());
  p.client.close();
  EXPECT_TRUE(wait_gone());
  ClientWatches::end(*req);
}

TEST_F(ClientWatchesTest, ClientThatLeftBeforeTheWatchStartedIsNoticedWhenItStarts) {
  watches.watch_later(req, p.server, false);
  p.client.close();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(wait_gone());
  // Within two ticks of joining (and not before the first).
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, kTick);
  EXPECT_LT(took, 20 * kTick);
  ClientWatches::end(*req);
}

TEST_F(ClientWatchesTest, PipelinedBytesAreNotAClose) {
  watches.watch_later(req, p.server, false);
  net::write(p.client, net::buffer(std::string_view("GET /health HTTP/1.1\r\n\r\n")));
  ioc.run_for(5 * kTick);
  EXPECT_FALSE(req->scope.client_gone());
  ClientWatches::end(*req);
  // The peeked bytes are still there for the session's next read.
  char buf[64];
  p.server.non_blocking(true);
  boost::system::error_code ec;
  const std::size_t n = p.server.read_some(net::buffer(buf), ec);
  EXPECT_FALSE(ec);
  EXPECT_EQ(std::string_view(buf, n), "GET /health HTTP/1.1\r\n\r\n");
}

// The connection's read buffer: kept by a request answered before its
// tick (the next request reuses it), released by one that lasts.
TEST_F(ClientWatchesTest, LastingRequestReleasesTheReadBuffer) {
  boost::beast::flat_buffer quick_buffer;
  quick_buffer.prepare(4096);
  auto quick = std::make_shared<WatchedRequest>();
  watches.watch_later(quick, p.server, false, &quick_buffer);
  ClientWatches::end(*quick);
  boost::beast::flat_buffer lasting_buffer;
  lasting_buffer.prepare(4096);
  auto lasting = std::make_shared<WatchedRequest>();
  watches.watch_later(lasting, p.server, false, &lasting_buffer);
  EXPECT_TRUE(run_until([&] { return lasting_buffer.capacity() == 0; }));
  // Ticks after that leave the quick request's buffer alone.
  ioc.run_for(2 * kTick);
  EXPECT_GE(quick_buffer.capacity(), 4096u);
  ClientWatches::end(*lasting);
}

TEST_F(ClientWatchesTest, TimerStopsWhenNothingWaits) {
  watches.watch_later(req, p.server, false);
  ClientWatches::end(*req);
  // One tick finds the list empty and does not re-arm: run() returns.
  const auto start = std::chrono::steady_clock::now();
  ioc.run();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

}  // namespace
}  // namespace pdgate
