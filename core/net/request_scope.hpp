// What one client request holds open upstream, so that a client that goes
// away can take it all down at once: engines see their connections close
// and abort the work (freeing KV blocks) instead of generating for nobody.
// Cancellation only: what the request came to (status, record) is
// core/pipeline/request_outcome.hpp's.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include <boost/asio/cancellation_signal.hpp>

#include "core/net/deadline_socket.hpp"

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

 private:
  bool client_gone_ = false;
  std::vector<DeadlineSocket*> streams_;
  std::vector<RequestScope*> children_;
  boost::asio::cancellation_signal watch_cancel_;
};

// One leg of a request that its sibling leg may abort (Mooncake's parallel
// legs): a child of the request's scope for as long as it lives, so the
// client leaving aborts it too.
struct LegScope {
  explicit LegScope(RequestScope& p) : parent(p) { parent.add_child(&scope); }
  ~LegScope() { parent.remove_child(&scope); }
  LegScope(const LegScope&) = delete;
  LegScope& operator=(const LegScope&) = delete;

  RequestScope& parent;
  RequestScope scope;
};

}  // namespace pdgate
