#include "core/upstream/probe_rounds.hpp"
#include "core/base/use_tuple.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace pdgate {

namespace net = boost::asio;

std::chrono::milliseconds probe_offset(std::uint64_t id, std::chrono::milliseconds interval) {
  // Weyl sequence: frac(id * phi) for consecutive ids fills [0, 1) evenly.
  constexpr double kPhi = 0.6180339887498949;
  double whole = 0;
  const double frac = std::modf(static_cast<double>(id) * kPhi, &whole);
  return std::chrono::milliseconds(
      static_cast<std::int64_t>(frac * static_cast<double>(interval.count())));
}

namespace {

// The probes in flight and a timer the dispatcher sleeps on while they
// fill every slot; a probe that ends wakes it by cancelling the timer.
struct Slots {
  explicit Slots(const net::any_io_executor& ex) : wake(ex) {}
  std::size_t in_flight = 0;
  net::steady_timer wake;

  void release() {
    --in_flight;
    wake.cancel();
  }
  // Returns once in_flight < limit. No wake-up can be lost: nothing runs
  // between the check and the start of the wait on this single thread.
  net::awaitable<void> wait_below(std::size_t limit) {
    while (in_flight >= limit) {
      wake.expires_at(net::steady_timer::time_point::max());
      co_await wake.async_wait(use_tuple);
    }
  }
};

}  // namespace

net::awaitable<void> run_probe_rounds(ProbeRounds rounds) {
  auto ex = co_await net::this_coro::executor;
  const std::size_t limit = std::max<std::size_t>(1, rounds.max_concurrency);
  // Shared with the probes, which may outlive this coroutine when the
  // executor stops with some still suspended.
  auto slots = std::make_shared<Slots>(ex);
  net::steady_timer timer(ex);
  std::vector<std::pair<std::chrono::milliseconds, InstancePtr>> order;
  // The first round probes every instance as soon as a slot is free: what
  // the probes learn (is an engine up, how loaded) is wanted soon after
  // start, not up to an interval later.
  for (bool first = true;; first = false) {
    const auto start = std::chrono::steady_clock::now();
    order.clear();
    for (auto& inst : rounds.instances()) {
      const auto offset =
          first ? std::chrono::milliseconds(0) : probe_offset(inst->id, rounds.interval);
      order.emplace_back(offset, std::move(inst));
    }
    std::sort(order.begin(), order.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [offset, inst] : order) {
      timer.expires_at(start + offset);
      co_await timer.async_wait(use_tuple);
      co_await slots->wait_below(limit);
      ++slots->in_flight;
      net::co_spawn(ex, rounds.probe(std::move(inst)),
                    [slots](const std::exception_ptr&) { slots->release(); });
    }
    order.clear();
    // The round ends when its last probe has.
    co_await slots->wait_below(1);
    timer.expires_at(start + rounds.interval);
    co_await timer.async_wait(use_tuple);
  }
}

}  // namespace pdgate
