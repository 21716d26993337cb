// The process's signals, handled in one place on the control thread:
// SIGTERM and SIGINT drain the gateway (stop accepting, let in-flight
// requests finish up to the shutdown deadline, then stop), SIGHUP reloads
// what can change at run time. Nothing here wakes while nothing happens:
// the drain is polled only once a drain has begun.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

namespace pdgate {

class ControlLoop {
 public:
  struct Hooks {
    std::function<void()> begin_drain;        // stop accepting
    std::function<std::int64_t()> in_flight;  // requests still being served
    std::function<void()> stop;               // stop serving (drained or deadline)
    std::function<void()> reload;             // SIGHUP
    std::function<void()> reopen_logs;        // SIGUSR1, after logrotate renamed them
  };

  // Arms the signals on `ioc` (which must run on the control thread).
  ControlLoop(boost::asio::io_context& ioc, Hooks hooks, std::chrono::milliseconds drain_deadline);
  ControlLoop(const ControlLoop&) = delete;
  ControlLoop& operator=(const ControlLoop&) = delete;

  // Starts the drain as SIGTERM would (tests, the admin API's shutdown).
  void drain();

 private:
  void wait_terminate();
  void wait_each(boost::asio::signal_set& set, const char* what, const std::function<void()>& hook);
  void check_drain();

  Hooks hooks_;
  std::chrono::milliseconds deadline_;
  boost::asio::signal_set terminate_;
  boost::asio::signal_set reload_;
  boost::asio::signal_set reopen_;
  boost::asio::steady_timer drain_timer_;
  std::chrono::steady_clock::time_point drain_until_{};
  bool draining_ = false;
};

}  // namespace pdgate
