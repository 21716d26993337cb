// Sends encoded KV event batches the way vLLM's ZmqEventPublisher does: a
// PUB socket carrying [topic, seq (8 bytes, big-endian), payload], and an
// optional ROUTER socket that replays the last buffer_steps batches from a
// requested sequence number. All socket work happens on the publisher's own
// thread; the sim's event loop only appends to a bounded queue.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <zmq.hpp>

#include "sim/kv_events.hpp"

namespace pdgate::sim {

class KvEventPublisher {
 public:
  struct Stats {
    std::uint64_t published = 0;  // batches sent on the PUB socket
    std::uint64_t dropped = 0;    // batches lost to a full queue (their seq is skipped)
    std::uint64_t replays = 0;    // replay requests answered
    std::int64_t next_seq = 0;
  };

  // Binds or connects the sockets (vLLM's rule, see endpoint_binds) and
  // starts the thread. On failure returns null and sets `error`.
  static std::unique_ptr<KvEventPublisher> open(const KvEventsConfig& config, std::string& error);

  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Never waits on the network: takes the next sequence number and queues
  // the batch. A full queue drops it and returns false; subscribers then see
  // a gap that a replay cannot fill, which is how they learn of the loss.
  bool publish(std::string payload);

  // Where subscribers connect: a bound wildcard port is resolved
  // ("tcp://0.0.0.0:41234"); a connected endpoint is shown as configured.
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  Stats stats() const;

 private:
  explicit KvEventPublisher(const KvEventsConfig& config);
  void run();
  void send_batch(std::int64_t seq, const std::string& payload);
  void serve_replay();

  KvEventsConfig config_;
  zmq::context_t context_{1};
  zmq::socket_t pub_;
  zmq::socket_t replay_;  // null handle when there is no replay endpoint
  std::string endpoint_;
  std::string replay_endpoint_;
  int wake_fd_ = -1;  // eventfd: the event loop wakes the thread without a zmq socket of its own

  mutable std::mutex mutex_;  // guards queue_, next_seq_, stop_
  std::deque<std::pair<std::int64_t, std::string>> queue_;
  std::int64_t next_seq_ = 0;
  bool stop_ = false;

  // Publisher thread only: the replay buffer, oldest first.
  std::deque<std::pair<std::int64_t, std::string>> buffer_;

  std::atomic<std::uint64_t> published_{0};
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> replays_{0};
  std::thread thread_;
};

}  // namespace pdgate::sim
