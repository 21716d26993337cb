// The waiting side of the Scheduler (scheduler.hpp): queued requests sleep
// on a timer that release() cancels to wake them in arrival order.
#include "sim/scheduler.hpp"

#include <algorithm>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <limits>

namespace pdgate::sim {

namespace net = boost::asio;

struct Scheduler::Waiter {
  explicit Waiter(const net::any_io_executor& ex)
      : timer(ex, net::steady_timer::time_point::max()) {}
  net::steady_timer timer;  // cancelled = woken
  bool granted = false;
};

Scheduler::Scheduler(std::size_t max_running, std::size_t max_waiting)
    : max_running_(max_running == 0 ? std::numeric_limits<std::size_t>::max() : max_running),
      max_waiting_(max_waiting) {}

// Out of line: the queue's shared_ptrs need Waiter complete to be destroyed.
Scheduler::~Scheduler() = default;

net::awaitable<Scheduler::Slot> Scheduler::acquire() {
  if (running_ < max_running_ && queue_.empty()) {
    ++running_;
    co_return Slot(this);
  }
  auto w = std::make_shared<Waiter>(co_await net::this_coro::executor);
  queue_.push_back(w);
  // Runs however the wait ends (grant, cancellation, or an exception).
  struct Leave {
    Scheduler* s;
    std::shared_ptr<Waiter> w;
    bool taken = false;
    ~Leave() {
      if (taken)
        return;
      if (w->granted) {
        s->release();  // granted in the same turn we were cancelled
      } else {
        s->queue_.erase(std::remove(s->queue_.begin(), s->queue_.end(), w), s->queue_.end());
      }
    }
  } leave{this, w};
  co_await w->timer.async_wait(net::as_tuple(net::use_awaitable));
  if (!w->granted)
    co_return Slot();
  leave.taken = true;
  co_return Slot(this);
}

void Scheduler::release() {
  --running_;
  while (!queue_.empty() && running_ < max_running_) {
    auto w = queue_.front();
    queue_.pop_front();
    w->granted = true;
    ++running_;
    w->timer.cancel();
  }
}

}  // namespace pdgate::sim
