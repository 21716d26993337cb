// Shares each replica's load on every engine with the other replicas
// through Redis, so that replicas behind one load balancer route on the
// whole cluster's load (core/upstream/cluster_load.hpp).
//
// Why its own PUBLISH channel and not the KV-index stream: load is a
// state, not a history. A report replaces the last one whole, so nothing
// needs to be kept for a replica that starts or reconnects (it has the
// cluster's load one report interval later), and reports sent every few
// milliseconds would push out of the stream's bounded history the KV
// records a starting replica needs. PUBLISH costs Redis no memory and
// reaches subscribers as soon as it is written.
//
// The thread publishes this replica's figures as soon as a request changes
// them (the registry's LoadChangeSignal wakes it: a pick reaches the other
// replicas within a Redis round trip), at most once per `interval` (1 ms
// by default: a burst of picks goes out in the next report, whole), and
// at least every `heartbeat` anyway; it applies other replicas' reports as
// they arrive, and forgets a replica not heard from for `expiry` (its
// process died, or it or this replica cannot reach Redis): no phantom
// load. Redis down: each replica routes on its own view once the others'
// reports expire; nothing a request does waits on this thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "core/base/result.hpp"
#include "core/observability/prometheus.hpp"
#include "core/upstream/cluster_load.hpp"
#include "plugins/redis_client_context.hpp"

namespace pdgate {

class Registry;
class RedisConnection;
struct RedisConnectionsShared;

struct RedisLoadSyncSettings {
  std::string redis_url;
  RedisClientContext redis;  // rediss://'s TLS, the connections' counters
  std::string channel = "pdgate:load";
  std::chrono::milliseconds interval{1};
  std::chrono::milliseconds heartbeat{250};
  std::chrono::milliseconds expiry{1000};
  std::chrono::milliseconds command_timeout{200};
  ClusterLoadLimits limits;
};

struct LoadSyncStats {
  std::atomic<std::uint64_t> published{0};
  std::atomic<std::uint64_t> applied{0};
  std::atomic<std::uint64_t> rejected{0};  // not a valid report
  std::atomic<std::uint64_t> refused{0};   // valid, past a bound (replicas, engines)
  std::atomic<std::uint64_t> expired{0};   // replicas forgotten for silence
  std::atomic<std::uint64_t> replicas{0};  // other replicas counted now
  std::atomic<std::uint64_t> ahead{0};     // of them, with load, before this one
  // Age of the last applied report when it arrived: its sender's wait for
  // the next interval + transit (system clocks of two machines).
  std::atomic<std::int64_t> lag_ms{0};
};

// pdgate_load_sync_reports_total{kind}, pdgate_load_sync_replicas,
// pdgate_load_sync_lag_ms, pdgate_load_sync_expired_total.
void write_load_sync_metrics(PrometheusText& m, const LoadSyncStats& s);

class RedisLoadSync {
 public:
  RedisLoadSync(const Registry& registry, RedisLoadSyncSettings settings);
  ~RedisLoadSync();
  RedisLoadSync(const RedisLoadSync&) = delete;
  RedisLoadSync& operator=(const RedisLoadSync&) = delete;

  // Starts the thread. Fails on a bad URL; Redis being unreachable is not
  // an error (it is retried).
  Result<bool> start();
  void stop();

  const LoadSyncStats& stats() const { return stats_; }

 private:
  boost::asio::awaitable<void> report_loop();
  // Turns the registry's load-change signal into a wake-up of report_loop.
  boost::asio::awaitable<void> wake_loop();
  void on_message(std::string_view payload);
  // After the replicas counted changed: the stats, and this replica's
  // place among them (Registry::replica_order).
  void note_replicas();

  const Registry& registry_;
  RedisLoadSyncSettings settings_;
  const std::uint64_t origin_;
  LoadSyncStats stats_;
  ClusterLoad cluster_;  // the thread's only

  std::unique_ptr<RedisConnectionsShared> shared_;
  boost::asio::io_context ioc_{1};
  std::shared_ptr<RedisConnection> publisher_;
  std::shared_ptr<RedisConnection> subscriber_;
  // What report_loop waits on; wake_loop cancels it.
  boost::asio::steady_timer timer_{ioc_};
  std::thread thread_;
};

}  // namespace pdgate
