#include "plugins/redis_load_sync.hpp"

#include <unistd.h>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "core/base/clock.hpp"
#include "core/upstream/instance.hpp"
#include "plugins/load_sync_wire.hpp"
#include "plugins/redis_connection.hpp"

namespace pdgate {

namespace {

constexpr std::string_view kPublish = "PUBLISH";

}  // namespace

void write_load_sync_metrics(PrometheusText& m, const LoadSyncStats& s) {
  m.counter("pdgate_load_sync_reports_total",
            "Load reports shared between gateway replicas: published by this one, applied "
            "from others, rejected (malformed) or refused (past a bound).");
  const std::pair<const char*, std::uint64_t> rows[] = {
      {"published", s.published.load()},
      {"applied", s.applied.load()},
      {"rejected", s.rejected.load()},
      {"refused", s.refused.load()},
  };
  for (const auto& [kind, n] : rows)
    m.sample("pdgate_load_sync_reports_total", {{"kind", kind}}, n);
  m.gauge("pdgate_load_sync_replicas", "Other gateway replicas whose load is counted now.");
  m.sample("pdgate_load_sync_replicas", std::uint64_t{s.replicas.load()});
  m.gauge("pdgate_load_sync_replicas_ahead",
          "Replicas with load that come before this one in the order rechecked picks wait "
          "in (pdgate.RECHECK waits this many --load-sync-recheck-slot).");
  m.sample("pdgate_load_sync_replicas_ahead", std::uint64_t{s.ahead.load()});
  m.counter("pdgate_load_sync_expired_total",
            "Replicas forgotten because no load report came from them in time.");
  m.sample("pdgate_load_sync_expired_total", std::uint64_t{s.expired.load()});
  m.gauge("pdgate_load_sync_lag_ms",
          "Age of the last applied load report when it arrived (ms; system clocks of two "
          "replicas).");
  m.sample("pdgate_load_sync_lag_ms", std::int64_t{s.lag_ms.load()});
}

RedisLoadSync::RedisLoadSync(const Registry& registry, RedisLoadSyncSettings settings)
    : registry_(registry),
      settings_(std::move(settings)),
      origin_(random_origin()),
      cluster_([&] {
        ClusterLoadLimits l = settings_.limits;
        l.expiry_ms = settings_.expiry.count();
        return l;
      }()),
      shared_(std::make_unique<RedisConnectionsShared>()) {}

RedisLoadSync::~RedisLoadSync() {
  stop();
}

Result<bool> RedisLoadSync::start() {
  auto endpoint = parse_redis_url(settings_.redis_url);
  if (!endpoint)
    return fail(endpoint.error());
  RedisConnectionSettings c;
  c.endpoint = *endpoint;
  c.context = settings_.redis;
  c.command_timeout = settings_.command_timeout;
  publisher_ = RedisConnection::create(ioc_.get_executor(), c, *shared_);
  subscriber_ = RedisConnection::create(ioc_.get_executor(), c, *shared_);
  subscriber_->subscribe(
      settings_.channel, [this](std::string_view payload) { on_message(payload); }, [] {});
  publisher_->start();
  subscriber_->start();
  net::co_spawn(ioc_, report_loop(), net::detached);
  net::co_spawn(ioc_, wake_loop(), net::detached);
  thread_ = std::thread([this] { ioc_.run(); });
  return true;
}

void RedisLoadSync::stop() {
  if (!thread_.joinable())
    return;
  net::post(ioc_, [this] {
    publisher_->stop();
    subscriber_->stop();
    ioc_.stop();
  });
  thread_.join();
  stats_.ahead.store(0, std::memory_order_relaxed);
  registry_.replica_order().set_ahead(0);  // no one to wait for any more
}

void RedisLoadSync::on_message(std::string_view payload) {
  auto r = load_wire::decode(payload);
  if (!r) {
    stats_.rejected.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // The instances are refreshed by the report loop, on every change of
  // this replica's load and at least every heartbeat: a message needs no
  // registry lock of its own (an instance added meanwhile gets the sums
  // at the next refresh).
  switch (cluster_.apply(*r, origin_, steady_now_ms())) {
    case ClusterLoad::Applied::applied:
      stats_.applied.fetch_add(1, std::memory_order_relaxed);
      stats_.lag_ms.store(std::max<std::int64_t>(0, wall_now_ms() - r->wall_ms),
                          std::memory_order_relaxed);
      break;
    case ClusterLoad::Applied::too_many_replicas:
    case ClusterLoad::Applied::too_many_entries:
      stats_.refused.fetch_add(1, std::memory_order_relaxed);
      break;
    case ClusterLoad::Applied::stale:
    case ClusterLoad::Applied::own:
      break;
  }
  note_replicas();
}

void RedisLoadSync::note_replicas() {
  stats_.replicas.store(cluster_.replicas(), std::memory_order_relaxed);
  const std::size_t ahead = cluster_.busy_before(origin_);
  stats_.ahead.store(ahead, std::memory_order_relaxed);
  registry_.replica_order().set_ahead(ahead);
}

net::awaitable<void> RedisLoadSync::wake_loop() {
  const LoadChangeSignal& signal = registry_.load_signal();
  // A descriptor of its own: the registry keeps the signal's.
  const int fd = signal.fd() < 0 ? -1 : ::dup(signal.fd());
  if (fd < 0)
    co_return;  // no wake-ups: the report loop polls every interval
  net::posix::stream_descriptor wakes(co_await net::this_coro::executor, fd);
  for (;;) {
    auto [ec] = co_await wakes.async_wait(net::posix::stream_descriptor::wait_read,
                                          net::as_tuple(net::use_awaitable));
    if (ec)
      co_return;
    signal.take();
    timer_.cancel();  // whatever the report loop waits for, it looks again
  }
}

net::awaitable<void> RedisLoadSync::report_loop() {
  using std::chrono::steady_clock;
  const LoadChangeSignal& signal = registry_.load_signal();
  const auto wait = [this](steady_clock::duration d) {
    timer_.expires_after(d);
    return timer_.async_wait(net::as_tuple(net::use_awaitable));
  };
  std::vector<LoadEntry> last;
  std::uint64_t seq = 0;
  steady_clock::time_point last_sent{};
  for (;;) {
    cluster_.use_instances(registry_.snapshot());
    const std::int64_t now_ms = steady_now_ms();
    if (const auto gone = cluster_.expire(now_ms); gone != 0) {
      stats_.expired.fetch_add(gone, std::memory_order_relaxed);
      note_replicas();
    }
    const auto now = steady_clock::now();
    const auto since_sent = now - last_sent;
    LoadReport r = cluster_.local_report(origin_, seq + 1, wall_now_ms());
    if (r.entries == last && since_sent < settings_.heartbeat) {
      // Nothing new: sleep until a request changes the load (or, without
      // wake-ups, the next poll), at most until the heartbeat is due.
      // Armed before looking once more, so that a change between the
      // report above and the arming is seen now (the loop makes a new
      // report at once), and one after it wakes.
      signal.arm();
      if (cluster_.local_report(origin_, seq + 1, 0).entries == last) {
        const auto until_heartbeat = settings_.heartbeat - since_sent;
        co_await wait(signal.fd() < 0
                          ? std::min<steady_clock::duration>(settings_.interval, until_heartbeat)
                          : until_heartbeat);
      }
      continue;
    }
    // At most one report per interval: a burst of picks is told in the
    // next one, whole.
    if (since_sent < settings_.interval) {
      co_await wait(settings_.interval - since_sent);
      continue;
    }
    if (!publisher_->ready()) {
      // Redis is away: the others forget us; nothing queues up.
      co_await wait(settings_.interval);
      continue;
    }
    const std::string payload = load_wire::encode(r);
    // (Built first: GCC 12 rejects a braced list of a literal in co_await.)
    std::vector<std::string_view> args{kPublish, settings_.channel, payload};
    const RedisReply reply = co_await publisher_->command(std::move(args));
    if (reply.type == RedisReply::Type::integer) {
      ++seq;
      last = std::move(r.entries);
      last_sent = now;
      stats_.published.fetch_add(1, std::memory_order_relaxed);
    } else {
      co_await wait(settings_.interval);
    }
  }
}

}  // namespace pdgate
