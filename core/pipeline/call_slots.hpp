// A bound on the engine calls of one kind a worker makes at once (encoder
// calls: --encode-max-inflight). A call takes a slot first; when none is
// free it waits in line, first come first served, up to a timeout. One
// worker's loop uses it, so it needs no lock; a slot given back goes
// straight to the first waiter.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <deque>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace pdgate {

class CallSlots {
 public:
  explicit CallSlots(std::size_t limit) : limit_(limit) {}
  CallSlots(const CallSlots&) = delete;
  CallSlots& operator=(const CallSlots&) = delete;

  // Takes a slot, waiting until one is given back or `timeout` passes
  // (false: no slot was taken).
  boost::asio::awaitable<bool> acquire(std::chrono::milliseconds timeout) {
    if (used_ < limit_ && waiters_.empty()) {
      ++used_;
      co_return true;
    }
    boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor, timeout);
    Waiter w{*this, &timer};
    waiters_.push_back(&timer);
    co_await timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    // release() took the timer out of the line when it handed the slot
    // over; still in line means the wait timed out.
    co_return !w.still_waiting();
  }

  // Gives a slot back: to the first waiter, else to the pool.
  void release() {
    if (!waiters_.empty()) {
      boost::asio::steady_timer* next = waiters_.front();
      waiters_.pop_front();
      next->cancel();  // the slot passes to it: used_ stays
      return;
    }
    --used_;
  }

  std::size_t in_use() const { return used_; }
  std::size_t waiting() const { return waiters_.size(); }

 private:
  // Leaves the line however the wait ends (a timeout, or the coroutine
  // destroyed while it waits), so no pointer to a gone timer stays.
  struct Waiter {
    CallSlots& slots;
    boost::asio::steady_timer* timer;
    bool still_waiting() const {
      auto& q = slots.waiters_;
      return std::find(q.begin(), q.end(), timer) != q.end();
    }
    ~Waiter() { std::erase(slots.waiters_, timer); }
  };

  std::size_t limit_;
  std::size_t used_ = 0;
  std::deque<boost::asio::steady_timer*> waiters_;
};

// A slot taken, given back when the call ends however it ends.
class CallSlot {
 public:
  explicit CallSlot(CallSlots& slots) : slots_(slots) {}
  CallSlot(const CallSlot&) = delete;
  CallSlot& operator=(const CallSlot&) = delete;
  ~CallSlot() { slots_.release(); }

 private:
  CallSlots& slots_;
};

}  // namespace pdgate
