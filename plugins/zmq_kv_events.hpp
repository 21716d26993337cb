// Receives vLLM KV events over ZMQ from every instance configured with an
// event endpoint, on one thread of its own (zmq_poll with a timeout: never
// on an event loop), and keeps the exact block index
// (core/routing/kv_block_index.hpp) in step. Sequence numbers are followed: a gap
// is repaired through the engine's replay socket within a bounded wait,
// else that instance's blocks are dropped and it is marked `fallback`
// until it can be trusted again (docs/kv-events.md).
//
// Feeds are independent: a replay is one more socket in the same poll (the
// feed's own stream waits for it, queued by ZMQ; every other feed goes on),
// and each feed has a replay budget, so an engine that keeps leaving gaps or
// numbering backwards costs the others nothing and is left in `fallback`.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/observability/prometheus.hpp"
#include "core/routing/kv_block_index.hpp"
#include "core/routing/kv_events.hpp"
#include "plugins/kv_event_decoder.hpp"

namespace pdgate {

struct ZmqKvEventsOptions {
  // A gap's replay: every reply must arrive within this, from the request.
  std::chrono::milliseconds replay_timeout{2'000};
  // How long one poll waits; also how soon subscription changes and stop
  // are noticed.
  std::chrono::milliseconds poll_interval{100};
  // A fallback instance with a replay socket asks for its whole history
  // this often (it is exact again if the engine still holds it).
  std::chrono::milliseconds resync_interval{30'000};
  // Replays per feed at most `replay_budget` in any `replay_window`: a gap
  // past it falls back at once. Keeps an engine that leaves gap after gap
  // (or a hostile one) from having pdgate replay forever.
  int replay_budget = 3;
  std::chrono::milliseconds replay_window{30'000};
  // An engine whose numbers start over (a restart) more than this often in
  // `restart_window` is not believed: it stays in fallback until the
  // window has passed without one.
  int restart_budget = 2;
  std::chrono::milliseconds restart_window{30'000};
  KvDecodeLimits limits;
  // Messages queued per instance at most (ZMQ's receive high-water mark);
  // with limits.max_bytes per message this bounds what a fast or hostile
  // publisher can make pdgate hold. Messages past it are lost, which the
  // sequence numbers then show as a gap.
  int queue_messages = 128;
};

// One instance's feed, as /metrics reports it.
struct KvFeedStats {
  InstanceKey key = 0;
  std::string instance_url;
  KvFeedState state = KvFeedState::degraded;
  std::uint64_t batches = 0;
  std::uint64_t events = 0;
  std::uint64_t decode_errors = 0;
  std::uint64_t gaps = 0;
  std::uint64_t replays = 0;
  std::uint64_t replay_failures = 0;
  std::uint64_t restarts = 0;        // sequence numbers starting over
  std::int64_t last_message_ms = 0;  // steady clock; 0: none yet
  double last_ts = 0;                // the engine's clock in the last batch, seconds
};

// The index key a decoded batch's events are applied under: the feed's
// instance. vLLM publishes each data-parallel rank on its own port
// (endpoint port + rank) and each rank is an instance of its own, keyed by
// its location, so a feed is one rank; a batch naming another rank than
// its feed's is refused before it gets here.
InstanceKey kv_event_source(const KvEventSubscription& feed, const KvEventBatch& batch);

class ZmqKvEvents final : public KvEventIngest {
 public:
  ZmqKvEvents(std::shared_ptr<KvBlockIndex> index, ZmqKvEventsOptions options);
  ~ZmqKvEvents() override;
  ZmqKvEvents(const ZmqKvEvents&) = delete;
  ZmqKvEvents& operator=(const ZmqKvEvents&) = delete;

  void start();
  void set_subscriptions(std::vector<KvEventSubscription> subs) override;
  void stop() override;

  std::vector<KvFeedStats> stats() const;
  // pdgate_kv_events_* families: counters per instance, its state, the
  // age of its last message and the engine-to-gateway lag.
  void write_metrics(PrometheusText& m) const;

 private:
  struct Feed;
  struct Replay;
  void run();
  void sync_subscriptions();
  void receive(Feed& f);
  void on_message(Feed& f, std::int64_t seq, std::span<const std::uint8_t> payload);
  // Takes `seq` as the next message: applies it, exact again if it was
  // only degraded.
  void accept(Feed& f, std::int64_t seq, std::span<const std::uint8_t> payload);
  bool apply(Feed& f, std::span<const std::uint8_t> payload);
  // Asks for [from, until): false when the feed has no replay socket, its
  // budget is spent, or the request cannot be sent. Its answers are read
  // by the poll loop (receive_replay); `held` is applied after them.
  bool start_replay(Feed& f, std::int64_t from, std::int64_t until, bool whole_history,
                    std::optional<std::pair<std::int64_t, std::vector<std::uint8_t>>> held);
  void receive_replay(Feed& f);
  void finish_replay(Feed& f, bool complete);
  void fall_back(Feed& f, const char* why);
  void publish(const Feed& f);

  const std::shared_ptr<KvBlockIndex> index_;
  const ZmqKvEventsOptions options_;
  std::unique_ptr<struct ZmqContext> zmq_;

  std::mutex pending_mu_;
  std::optional<std::vector<KvEventSubscription>> pending_;

  // Owned by the ingest thread.
  std::map<InstanceKey, std::unique_ptr<Feed>> feeds_;

  // What stats() reads: a copy the ingest thread refreshes after each
  // message.
  mutable std::mutex stats_mu_;
  std::map<InstanceKey, KvFeedStats> stats_;

  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace pdgate
