// A worker's bound on concurrent engine calls (core/pipeline/call_slots.hpp):
// slots up to the limit at once, the rest wait in line and get the slots
// given back in their order, and a wait that times out takes none.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <string>
#include <vector>

#include "core/pipeline/call_slots.hpp"

namespace pdgate {
namespace {

using namespace std::chrono_literals;
namespace net = boost::asio;

TEST(CallSlots, WaitersGetReleasedSlotsInOrderAndTimeOutWithoutOne) {
  net::io_context io;
  CallSlots slots(2);
  std::vector<std::string> log;
  // Four calls of 20 ms each: two at once, then the next two in order.
  auto call = [&](std::string name) -> net::awaitable<void> {
    if (!co_await slots.acquire(1s)) {
      log.push_back(name + " timed out");
      co_return;
    }
    CallSlot held(slots);
    log.push_back(name + " in " + std::to_string(slots.in_use()));
    net::steady_timer t(io, 20ms);
    co_await t.async_wait(net::use_awaitable);
  };
  for (const char* n : {"a", "b", "c", "d"})
    net::co_spawn(io, call(n), net::detached);
  io.run();
  EXPECT_EQ(log, (std::vector<std::string>{"a in 1", "b in 2", "c in 2", "d in 2"}));
  EXPECT_EQ(slots.in_use(), 0u);
  EXPECT_EQ(slots.waiting(), 0u);

  // A waiter whose time runs out leaves the line with no slot.
  io.restart();
  log.clear();
  auto hold = [&]() -> net::awaitable<void> {
    co_await slots.acquire(1s);
    co_await slots.acquire(1s);
    net::steady_timer t(io, 100ms);
    co_await t.async_wait(net::use_awaitable);
    slots.release();
    slots.release();
  };
  auto impatient = [&]() -> net::awaitable<void> {
    log.push_back(co_await slots.acquire(10ms) ? "got one" : "timed out");
  };
  net::co_spawn(io, hold(), net::detached);
  net::co_spawn(io, impatient(), net::detached);
  io.run();
  EXPECT_EQ(log, (std::vector<std::string>{"timed out"}));
  EXPECT_EQ(slots.in_use(), 0u);
  EXPECT_EQ(slots.waiting(), 0u);
}

}  // namespace
}  // namespace pdgate
