// What one client request holds open upstream, so that a client that goes
// away can take it all down at once: engines see their connections close
// and abort the work (freeing KV blocks) instead of generating for nobody.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include <boost/asio/cancellation_signal.hpp>

#include "core/net/deadline_socket.hpp"
#include "core/observability/request_record.hpp"

namespace pdgate {

class RequestScope {
 public:
  bool client_gone() const { return client_gone_; }

  // Called when the client's connection closes mid-request.
  void on_client_gone() {
    client_gone_ = true;
    // Copy: closing a stream completes its pending operation, whose
    // continuation may unregister it while we iterate.
    auto streams = streams_;
    for (auto* s : streams) {
      boost::beast::error_code ec;
      s->socket().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ec);
      s->close();
    }
    auto children = children_;
    for (auto* c : children)
      c->on_client_gone();
  }

  // A stage that may give up on its own upstreams (the encoder fan-out
  // failing fast) runs them in a child scope: on_client_gone() on the
  // child aborts only them, and the client leaving aborts the child too.
  void add_child(RequestScope* c) {
    children_.push_back(c);
    if (client_gone_)
      c->on_client_gone();
  }
  void remove_child(RequestScope* c) {
    children_.erase(std::remove(children_.begin(), children_.end(), c), children_.end());
  }

  void add(DeadlineSocket* s) { streams_.push_back(s); }
  void remove(DeadlineSocket* s) {
    streams_.erase(std::remove(streams_.begin(), streams_.end(), s), streams_.end());
  }
  std::size_t open_upstreams() const { return streams_.size(); }

  // Cancels the watch on the client's socket when the request completes.
  boost::asio::cancellation_signal& watch_cancel() { return watch_cancel_; }

  // For /metrics: the status the client was answered with and the stage
  // that decided it ("gateway" when no engine did).
  unsigned status = 0;
  const char* stage = "gateway";
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
  // For the access log, read at the request's exit; null when the log is
  // off, so that a held stream does not carry it.
  std::unique_ptr<RequestRecord> record;
  // Prompt + completion tokens the engine reported (its `usage`), for the
  // client key's tokens-per-minute limit.
  std::uint64_t tokens_used = 0;
  void count_sent(std::size_t bytes) {
    if (record)
      record->bytes_sent += bytes;
  }

 private:
  bool client_gone_ = false;
  std::vector<DeadlineSocket*> streams_;
  std::vector<RequestScope*> children_;
  boost::asio::cancellation_signal watch_cancel_;
};

}  // namespace pdgate
