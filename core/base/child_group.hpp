// Children of one request (an encoder per image, a /health per engine) run
// as coroutines of their own while the parent waits for every one of them.
// The group counts them however they end: spawned with net::detached, a
// child that threw would never be counted and its parent would wait for
// ever, its frame (which the children refer to) alive with it.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace pdgate {

class ChildGroup {
 public:
  // `on_throw` runs once, when the first child ends with an exception
  // (for example to abort its siblings).
  explicit ChildGroup(const boost::asio::any_io_executor& ex, std::function<void()> on_throw = {})
      : done_(ex), on_throw_(std::move(on_throw)) {
    done_.expires_at(boost::asio::steady_timer::time_point::max());
  }
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;

  // Starts `child` on the group's executor.
  void spawn(boost::asio::awaitable<void> child) {
    ++pending_;
    boost::asio::co_spawn(done_.get_executor(), std::move(child), [this](std::exception_ptr e) {
      if (e && !failure_) {
        failure_ = describe(e);
        if (on_throw_)
          on_throw_();
      }
      if (--pending_ == 0)
        done_.cancel();
    });
  }

  // Returns once every spawned child has ended. The group must outlive
  // this wait (its children's completions refer to it).
  boost::asio::awaitable<void> wait() {
    while (pending_ > 0) {
      auto [ec] = co_await done_.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
      (void)ec;
    }
  }

  // What the first child that threw threw, if one did.
  const std::optional<std::string>& failure() const { return failure_; }

 private:
  static std::string describe(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      return ex.what();
    } catch (...) {
      return "unknown exception";
    }
  }

  std::size_t pending_ = 0;
  boost::asio::steady_timer done_;
  std::function<void()> on_throw_;
  std::optional<std::string> failure_;
};

}  // namespace pdgate
