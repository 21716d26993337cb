// Admission to the simulated engine's batch. The engine runs at most
// --max-num-seqs requests and queues the rest FIFO; prefills share the
// --prefill-lanes the same way. What a running request holds in the KV
// cache is counted here too, for vllm:kv_cache_usage_perc.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <utility>

#include <boost/asio/awaitable.hpp>

namespace pdgate::sim {

// A FIFO semaphore: acquire() grants a slot at once while fewer than `max`
// are held and nobody queues; otherwise the caller waits its turn. A waiter
// cancelled while queued (client gone) leaves the queue without a slot.
class Scheduler {
 public:
  class Slot {
   public:
    Slot() = default;
    explicit Slot(Scheduler* s) : s_(s) {}
    Slot(Slot&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    Slot& operator=(Slot&& o) noexcept {
      if (this != &o) {
        reset();
        s_ = std::exchange(o.s_, nullptr);
      }
      return *this;
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { reset(); }
    explicit operator bool() const { return s_ != nullptr; }
    void reset() {
      if (s_ != nullptr)
        std::exchange(s_, nullptr)->release();
    }

   private:
    Scheduler* s_ = nullptr;
  };

  // `max_running` 0 means no limit.
  Scheduler(std::size_t max_running, std::size_t max_waiting);
  ~Scheduler();

  // Checked before a request commits (streaming headers), so a full queue
  // can still be answered with a plain 503.
  bool would_reject() const { return running_ >= max_running_ && queue_.size() >= max_waiting_; }

  // An empty slot means the wait was cancelled.
  boost::asio::awaitable<Slot> acquire();

  std::size_t running() const { return running_; }
  std::size_t waiting() const { return queue_.size(); }

 private:
  // A queued acquire(); defined with the timer that wakes it in
  // scheduler.cpp, so this header stays free of Asio's timer headers.
  struct Waiter;

  void release();

  std::size_t max_running_;
  std::size_t max_waiting_;
  std::size_t running_ = 0;
  std::deque<std::shared_ptr<Waiter>> queue_;
};

// KV blocks a running request holds (prompt + generated so far), counted in
// vllm:kv_cache_usage_perc.
class BlockHold {
 public:
  explicit BlockHold(std::size_t& total) : total_(total) {}
  BlockHold(const BlockHold&) = delete;
  BlockHold& operator=(const BlockHold&) = delete;
  ~BlockHold() { total_ -= n_; }
  void set(std::size_t n) {
    total_ = total_ - n_ + n;
    n_ = n;
  }

 private:
  std::size_t& total_;
  std::size_t n_ = 0;
};

}  // namespace pdgate::sim
