// A KvLocationIndex shared by gateway replicas through a Redis stream.
//
// Lookups never leave the process: they read the local index, which this
// class feeds with this replica's records and with every other replica's.
// Each record is also queued, and a background thread appends the queue
// to the stream in batches (one XADD every few milliseconds, on its own
// connection, MAXLEN-trimmed) and reads the other replicas' batches back
// (XREAD BLOCK from the last entry it saw, on another connection), so
// every replica sees the cluster's routing within milliseconds.
//
// Redis down: routing goes on with what each replica knows; the queue
// keeps (up to a byte bound, then drops the oldest batch and counts it)
// what was recorded meanwhile and is written once Redis is back, and the
// reader resumes from its last entry. A replica that starts reads the
// stream's retained history first.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "core/base/result.hpp"
#include "core/observability/prometheus.hpp"
#include "core/routing/kv_location_index.hpp"
#include "plugins/kv_index_wire.hpp"
#include "plugins/redis_client_context.hpp"
#include "plugins/redis_protocol.hpp"

namespace pdgate {

class RedisConnection;
struct RedisConnectionsShared;

struct RedisKvIndexSettings {
  std::string redis_url;
  RedisClientContext redis;  // rediss://'s TLS, the connections' counters
  std::string stream_key = "pdgate:kv-index";
  // Batches the stream retains (XADD MAXLEN ~): what a replica that starts
  // or reconnects can catch up on; with batch_bytes, what bounds the
  // stream's memory in Redis (64 MiB at most, a few MiB typically).
  std::size_t stream_max_batches = 1024;
  // How long a record waits for others to share its XADD, and the most a
  // batch carries (a record larger than that goes alone).
  std::chrono::milliseconds batch_window{2};
  std::size_t batch_bytes = 64u << 10;
  // Bytes of records queued while Redis is slow or down; beyond, the
  // oldest batch is dropped.
  std::size_t max_queued_bytes = 16u << 20;
  // Records older than this are not applied (the local index's TTL).
  std::int64_t ttl_ms = 600'000;
  std::chrono::milliseconds read_block{1000};
  std::chrono::milliseconds command_timeout{500};
  std::chrono::milliseconds retry_interval{100};
};

// Counters for /metrics (and tests).
struct KvIndexStats {
  std::atomic<std::uint64_t> published{0};  // records written to the stream
  std::atomic<std::uint64_t> applied{0};    // other replicas' records applied here
  std::atomic<std::uint64_t> dropped{0};    // records lost to the queue bound
  std::atomic<std::uint64_t> rejected{0};   // malformed batches skipped
  // Age of the last applied batch's newest record when it was applied:
  // publish delay + transit + read delay (system clocks of two machines).
  std::atomic<std::int64_t> lag_ms{0};
  std::atomic<std::uint64_t> queued_bytes{0};
};

// pdgate_kv_index_records_total{kind=published|applied|dropped|rejected},
// pdgate_kv_index_lag_ms, pdgate_kv_index_queued_bytes.
void write_kv_index_metrics(PrometheusText& m, const KvIndexStats& s);

class RedisKvIndex final : public KvLocationIndex {
 public:
  // `local`: the in-process index lookups are answered from.
  RedisKvIndex(std::shared_ptr<KvLocationIndex> local, RedisKvIndexSettings settings);
  ~RedisKvIndex() override;
  RedisKvIndex(const RedisKvIndex&) = delete;
  RedisKvIndex& operator=(const RedisKvIndex&) = delete;

  // Starts the background thread (connects, publishes, reads). Fails on a
  // bad URL; Redis being unreachable is not an error (it is retried).
  Result<bool> start();
  // Stops and joins the thread; records still queued are lost.
  void stop();

  void record_prefix(const std::vector<std::uint64_t>& hashes, InstanceKey where,
                     std::int64_t now_ms) override;
  std::vector<std::pair<InstanceKey, std::size_t>> prefix_matches(
      const std::vector<std::uint64_t>& hashes, std::int64_t now_ms,
      std::size_t enough) const override {
    return local_->prefix_matches(hashes, now_ms, enough);
  }
  void record_conversation(std::string_view conversation_id,
                           const ConversationRoute& route) override;
  std::optional<ConversationRoute> conversation(std::string_view conversation_id) const override {
    return local_->conversation(conversation_id);
  }
  // Local only: every replica learns the removal from the shared registry.
  void forget_instance(InstanceKey key, std::int64_t now_ms) override {
    local_->forget_instance(key, now_ms);
  }

  // Applies a batch read from the stream (public for tests): records from
  // this replica or older than the TTL are skipped.
  void apply(const kv_wire::Batch& batch, std::int64_t wall_now_ms, std::int64_t steady_now_ms);

  const KvIndexStats& stats() const { return stats_; }
  std::uint64_t origin() const { return origin_; }

 private:
  struct Pending {
    std::string body;
    std::uint64_t records = 0;
  };
  // Queues an encoded record (any thread).
  template <typename Encode>
  void enqueue(Encode&& encode);
  boost::asio::awaitable<void> publish_loop();
  boost::asio::awaitable<void> read_loop();

  std::shared_ptr<KvLocationIndex> local_;
  RedisKvIndexSettings settings_;
  const std::uint64_t origin_;
  KvIndexStats stats_;

  std::mutex mu_;  // guards the queue
  std::deque<Pending> sealed_;
  Pending open_;
  std::size_t queued_bytes_ = 0;
  bool wake_posted_ = false;

  // Before ioc_: the connections that ioc_'s handlers keep alive use it
  // until ioc_ is destroyed.
  std::unique_ptr<RedisConnectionsShared> shared_;
  boost::asio::io_context ioc_{1};
  std::shared_ptr<RedisConnection> writer_;
  std::shared_ptr<RedisConnection> reader_;
  // The publisher's wait; cancelled (on ioc_) when records arrive.
  std::unique_ptr<boost::asio::steady_timer> wake_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace pdgate
