#include "core/gateway/control_loop.hpp"

#include <csignal>

#include <spdlog/spdlog.h>

namespace pdgate {

namespace {
// How often a drain checks whether the last request has finished.
constexpr auto kDrainPoll = std::chrono::milliseconds(50);
}  // namespace

ControlLoop::ControlLoop(boost::asio::io_context& ioc, Hooks hooks,
                         std::chrono::milliseconds drain_deadline)
    : hooks_(std::move(hooks)),
      deadline_(drain_deadline),
      terminate_(ioc, SIGINT, SIGTERM),
      reload_(ioc, SIGHUP),
      reopen_(ioc, SIGUSR1),
      drain_timer_(ioc) {
  wait_terminate();
  wait_each(reload_, "SIGHUP: reloading", hooks_.reload);
  wait_each(reopen_, "SIGUSR1: reopening the log files", hooks_.reopen_logs);
}

void ControlLoop::wait_terminate() {
  terminate_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec)
      return;
    if (draining_) {
      // A second signal while draining: stop now, as nginx's fast shutdown.
      spdlog::warn("signal {} while draining: stopping with {} request(s) in flight", sig,
                   hooks_.in_flight());
      drain_timer_.cancel();
      hooks_.stop();
      return;
    }
    spdlog::info("signal {}: no longer accepting; draining {} in-flight request(s)", sig,
                 hooks_.in_flight());
    drain();
    wait_terminate();
  });
}

// SIGHUP and SIGUSR1: log, run the hook, wait for the next one.
void ControlLoop::wait_each(boost::asio::signal_set& set, const char* what,
                            const std::function<void()>& hook) {
  set.async_wait([this, &set, what, &hook](const boost::system::error_code& ec, int) {
    if (ec)
      return;
    spdlog::info("{}", what);
    if (hook)
      hook();
    wait_each(set, what, hook);
  });
}

void ControlLoop::drain() {
  if (draining_)
    return;
  draining_ = true;
  drain_until_ = std::chrono::steady_clock::now() + deadline_;
  hooks_.begin_drain();
  check_drain();
}

void ControlLoop::check_drain() {
  const auto left = hooks_.in_flight();
  if (left <= 0 || std::chrono::steady_clock::now() >= drain_until_) {
    if (left > 0)
      spdlog::warn("drain deadline passed with {} request(s) in flight", left);
    terminate_.cancel();
    reload_.cancel();
    reopen_.cancel();
    hooks_.stop();
    return;
  }
  drain_timer_.expires_after(kDrainPoll);
  drain_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec)
      check_drain();
  });
}

}  // namespace pdgate
