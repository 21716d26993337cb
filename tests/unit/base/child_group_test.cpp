// ChildGroup: a parent waits for every child however it ends, an
// exception included, and learns what the first one threw.
#include "core/base/child_group.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <vector>

#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

namespace pdgate {
namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;

net::awaitable<void> sleep_then(std::chrono::milliseconds d, std::vector<int>& log, int id,
                                bool do_throw) {
  net::steady_timer t(co_await net::this_coro::executor);
  t.expires_after(d);
  co_await t.async_wait(net::use_awaitable);
  log.push_back(id);
  if (do_throw)
    throw std::runtime_error("child " + std::to_string(id) + " broke");
}

TEST(ChildGroup, WaitsForEveryChildEvenWhenOneThrows) {
  net::io_context ioc;
  std::vector<int> log;
  int throws_seen = 0;
  bool parent_done = false;
  std::optional<std::string> failure;
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        ChildGroup group(co_await net::this_coro::executor, [&] { ++throws_seen; });
        group.spawn(sleep_then(30ms, log, 1, false));
        group.spawn(sleep_then(5ms, log, 2, true));
        group.spawn(sleep_then(10ms, log, 3, true));
        group.spawn(sleep_then(0ms, log, 4, false));
        co_await group.wait();
        failure = group.failure();
        parent_done = true;
      },
      net::detached);
  ioc.run_for(5s);
  EXPECT_TRUE(parent_done);
  EXPECT_EQ(log, (std::vector<int>{4, 2, 3, 1}));  // the parent waited for the slowest
  ASSERT_TRUE(failure);
  EXPECT_EQ(*failure, "child 2 broke");  // the first to throw
  EXPECT_EQ(throws_seen, 1);
}

TEST(ChildGroup, NoChildrenAndNoFailures) {
  net::io_context ioc;
  int rounds = 0;
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        ChildGroup empty(co_await net::this_coro::executor);
        co_await empty.wait();
        EXPECT_FALSE(empty.failure());
        ++rounds;
        std::vector<int> log;
        ChildGroup group(co_await net::this_coro::executor);
        for (int i = 0; i < 3; ++i)
          group.spawn(sleep_then(1ms, log, i, false));
        co_await group.wait();
        EXPECT_FALSE(group.failure());
        EXPECT_EQ(log.size(), 3u);
        ++rounds;
      },
      net::detached);
  ioc.run_for(5s);
  EXPECT_EQ(rounds, 2);
}

}  // namespace
}  // namespace pdgate
