// DeadlineSocket (core/net/deadline_socket.hpp): operations end at the expiry
// with beast::error::timeout, as tcp_stream's do; an expiry that passes
// with nothing pending cuts nothing; the context's Deadlines service keeps
// only the sockets whose operations are pending.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "core/net/deadline_socket.hpp"
#include "tests/unit/loopback_pair.hpp"

namespace pdgate {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
constexpr auto tuple_token = net::as_tuple(net::use_awaitable);

using Pair = test::LoopbackPair;

struct ReadResult {
  beast::error_code ec = net::error::fault;
  std::size_t n = 0;
  milliseconds took{};
};

net::awaitable<void> read_one(DeadlineSocket& s, ReadResult& r) {
  char buf[16];
  const auto start = Clock::now();
  auto [ec, n] = co_await s.async_read_some(net::buffer(buf), tuple_token);
  r.ec = ec;
  r.n = n;
  r.took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

// One connection whose gateway side is a DeadlineSocket, and a read on it.
class DeadlineSocketRead : public ::testing::Test {
 protected:
  void start_read() { net::co_spawn(ioc, read_one(s, r), net::detached); }

  net::io_context ioc;
  Pair p{ioc};
  DeadlineSocket s{std::move(p.server)};
  ReadResult r;
};

TEST_F(DeadlineSocketRead, PendingReadEndsWithTimeoutAtItsExpiry) {
  s.expires_after(milliseconds(60));
  start_read();
  ioc.run();
  EXPECT_EQ(r.ec, beast::error::timeout);
  EXPECT_GE(r.took, milliseconds(55));
  EXPECT_LT(r.took, milliseconds(2000));
  EXPECT_FALSE(s.socket().is_open());  // closed, as tcp_stream closes it
  EXPECT_EQ(Deadlines::of(ioc.get_executor()).watched(), 0u);
}

TEST_F(DeadlineSocketRead, ReadThatCompletesInTimeIsNotCutAndLeavesTheService) {
  s.expires_after(std::chrono::seconds(2));
  start_read();
  // The peer writes well before the expiry.
  net::steady_timer t(ioc, milliseconds(10));
  t.async_wait([&](auto) { net::write(p.client, net::buffer(std::string_view("abc"))); });
  const auto start = Clock::now();
  ioc.run();
  // No wait of the service's timer is left to hold run() until the expiry.
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
  EXPECT_FALSE(r.ec) << r.ec.message();
  EXPECT_EQ(r.n, 3u);
  EXPECT_EQ(Deadlines::of(ioc.get_executor()).watched(), 0u);
  EXPECT_TRUE(s.socket().is_open());
}

// The expiry bounds operations, not the connection: once it has passed
// with nothing pending, the socket is still open, and the next operation
// started fails at once with timeout (as with tcp_stream).
TEST_F(DeadlineSocketRead, ExpiryPassingWhileIdleCutsNothingUntilTheNextOperation) {
  s.expires_after(milliseconds(20));
  net::steady_timer t(ioc, milliseconds(80));
  t.wait();
  ioc.run();  // lets a timer of the service, if it had one, fire
  ioc.restart();
  EXPECT_TRUE(s.socket().is_open());

  start_read();
  ioc.run();
  EXPECT_EQ(r.ec, beast::error::timeout);
  EXPECT_LT(r.took, milliseconds(1000));  // at once: no expiry is ahead

  // A new expiry, far away, on a new connection: reads work again.
  ioc.restart();
  Pair q(ioc);
  DeadlineSocket s2(std::move(q.server));
  s2.expires_after(std::chrono::seconds(30));
  net::write(q.client, net::buffer(std::string_view("x")));
  ReadResult r2;
  net::co_spawn(ioc, read_one(s2, r2), net::detached);
  ioc.run();
  EXPECT_FALSE(r2.ec) << r2.ec.message();
  EXPECT_EQ(r2.n, 1u);
}

TEST(DeadlineSocket, SocketsExpireInTheOrderOfTheirExpiries) {
  net::io_context ioc;
  std::vector<std::unique_ptr<Pair>> pairs;
  std::vector<std::unique_ptr<DeadlineSocket>> sockets;
  std::vector<Clock::time_point> ended(3);
  std::vector<beast::error_code> errors(3);
  const auto start = Clock::now();
  // Armed latest first: each later one is the earliest so far.
  for (int i = 2; i >= 0; --i) {
    pairs.push_back(std::make_unique<Pair>(ioc));
    sockets.push_back(std::make_unique<DeadlineSocket>(std::move(pairs.back()->server)));
    DeadlineSocket& s = *sockets.back();
    s.expires_at(start + milliseconds(40 * (i + 1)));
    net::co_spawn(
        ioc,
        [&s, &ended, &errors, i]() -> net::awaitable<void> {
          char buf[4];
          auto [ec, n] = co_await s.async_read_some(net::buffer(buf), tuple_token);
          errors[i] = ec;
          ended[i] = Clock::now();
        },
        net::detached);
  }
  ioc.run();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(errors[i], beast::error::timeout) << i;
    EXPECT_GE(ended[i] - start, milliseconds(40 * (i + 1)) - milliseconds(5)) << i;
  }
  EXPECT_LT(ended[0], ended[1]);
  EXPECT_LT(ended[1], ended[2]);
}

TEST_F(DeadlineSocketRead, NewExpiryAppliesToThePendingOperation) {
  s.expires_after(std::chrono::seconds(30));
  start_read();
  net::steady_timer t(ioc, milliseconds(20));
  t.async_wait([&](auto) { s.expires_after(milliseconds(30)); });
  ioc.run();
  EXPECT_EQ(r.ec, beast::error::timeout);
  EXPECT_GE(r.took, milliseconds(45));
  EXPECT_LT(r.took, milliseconds(2000));
}

TEST_F(DeadlineSocketRead, ExpiresNeverLeavesThePendingOperationUnbounded) {
  s.expires_after(milliseconds(300));
  start_read();
  net::steady_timer t1(ioc, milliseconds(5));
  t1.async_wait([&](auto) { s.expires_never(); });
  net::steady_timer t2(ioc, milliseconds(600));
  t2.async_wait([&](auto) { net::write(p.client, net::buffer(std::string_view("late"))); });
  ioc.run();
  EXPECT_FALSE(r.ec) << r.ec.message();
  EXPECT_EQ(r.n, 4u);
}

TEST(DeadlineSocket, ConnectWithinTheExpirySucceedsAndAnExpiredOneFailsAtOnce) {
  net::io_context ioc;
  tcp::acceptor acc(ioc, tcp::endpoint(net::ip::address_v4::loopback(), 0));
  DeadlineSocket s(ioc.get_executor());
  s.expires_after(std::chrono::seconds(5));
  beast::error_code first = net::error::fault, second = net::error::fault;
  DeadlineSocket late(ioc.get_executor());
  late.expires_at(Clock::now() - milliseconds(1));
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        std::tie(first) = co_await s.async_connect(acc.local_endpoint(), tuple_token);
        std::tie(second) = co_await late.async_connect(acc.local_endpoint(), tuple_token);
      },
      net::detached);
  ioc.run();
  EXPECT_FALSE(first) << first.message();
  EXPECT_EQ(second, beast::error::timeout);
  EXPECT_FALSE(late.socket().is_open());  // not opened by the failed connect
  EXPECT_EQ(Deadlines::of(ioc.get_executor()).watched(), 0u);
}

// A context destroyed with a timed read still pending: the coroutine (and
// the socket in its frame) goes with it, after the service has shut down.
TEST(DeadlineSocket, ContextDestroyedWithATimedOperationPending) {
  auto ioc = std::make_unique<net::io_context>();
  auto p = std::make_unique<Pair>(*ioc);
  net::co_spawn(
      *ioc,
      [server = std::move(p->server)]() mutable -> net::awaitable<void> {
        DeadlineSocket s(std::move(server));
        s.expires_after(std::chrono::seconds(30));
        char buf[4];
        co_await s.async_read_some(net::buffer(buf), tuple_token);
      },
      net::detached);
  ioc->run_for(milliseconds(20));
  EXPECT_EQ(Deadlines::of(ioc->get_executor()).watched(), 1u);
  p.reset();    // its sockets belong to the context
  ioc.reset();  // ASan reports any use of the service or socket after this
}

}  // namespace
}  // namespace pdgate
