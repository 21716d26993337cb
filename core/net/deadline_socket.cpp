#include "core/net/deadline_socket.hpp"

#include <boost/asio/execution/context.hpp>
#include <boost/asio/query.hpp>

namespace pdgate {

DeadlineSocket::DeadlineSocket(socket_type socket)
    : socket_(std::move(socket)), deadlines_(Deadlines::of(socket_.get_executor())) {}

DeadlineSocket::DeadlineSocket(const executor_type& ex)
    : socket_(ex), deadlines_(Deadlines::of(ex)) {}

DeadlineSocket::~DeadlineSocket() {
  if (is_linked())
    deadlines_.forget(*this);
}

void DeadlineSocket::expires_at(clock::time_point t) {
  if (is_linked())
    deadlines_.forget(*this);
  expiry_ = t;
  // A new expiry for operations already pending bounds them from now on.
  if (pending_ > 0 && t != clock::time_point::max())
    deadlines_.watch(*this);
}

void DeadlineSocket::expires_never() {
  expires_at(clock::time_point::max());
}

void DeadlineSocket::close() {
  boost::beast::error_code ignored;
  socket_.close(ignored);
}

bool DeadlineSocket::begin_op() {
  if (pending_++ > 0)
    return !timed_out_;
  timed_out_ = false;
  if (expiry_ == clock::time_point::max())
    return true;
  if (expiry_ <= clock::now()) {
    expire();
    return false;
  }
  deadlines_.watch(*this);
  return true;
}

boost::beast::error_code DeadlineSocket::end_op(boost::beast::error_code ec) {
  if (--pending_ == 0 && is_linked())
    deadlines_.forget(*this);
  return timed_out_ ? boost::beast::error::timeout : ec;
}

void DeadlineSocket::expire() {
  timed_out_ = true;
  close();
}

Deadlines& Deadlines::of(const boost::asio::any_io_executor& ex) {
  return boost::asio::use_service<Deadlines>(
      boost::asio::query(ex, boost::asio::execution::context));
}

void Deadlines::watch(DeadlineSocket& s) {
  if (shut_down_)
    return;
  order_.insert(s);
  if (s.expiry_ < timer_at_)
    wait_until(s.expiry_, s.get_executor());
}

void Deadlines::forget(DeadlineSocket& s) {
  order_.erase(order_.iterator_to(s));
  // With sockets left, the timer keeps its wait: if it fires early, it
  // waits again for the earliest left (re-arming it for every operation
  // that completes in time would cost more). With none left, its wait
  // would keep the context's run() from returning: it goes.
  if (order_.empty() && timer_at_ != DeadlineSocket::clock::time_point::max()) {
    timer_at_ = DeadlineSocket::clock::time_point::max();
    timer_->cancel();
  }
}

void Deadlines::wait_until(DeadlineSocket::clock::time_point t,
                           const boost::asio::any_io_executor& ex) {
  if (!timer_)
    timer_.emplace(ex);
  timer_at_ = t;
  // Replaces the pending wait, if any (its handler sees operation_aborted).
  timer_->expires_at(t);
  timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec)
      on_timer();
  });
}

void Deadlines::on_timer() {
  timer_at_ = DeadlineSocket::clock::time_point::max();
  const auto now = DeadlineSocket::clock::now();
  while (!order_.empty() && order_.begin()->expiry_ <= now) {
    DeadlineSocket& s = *order_.begin();
    order_.erase(order_.begin());
    s.expire();
  }
  if (!order_.empty())
    wait_until(order_.begin()->expiry_, timer_->get_executor());
}

void Deadlines::shutdown() {
  shut_down_ = true;
  // The hooks are reset, so sockets destroyed later do not touch the order.
  order_.clear();
  // The timer goes now, while every service of the context is still
  // there: its own service was made after this one (with the first
  // socket watched), so it is destroyed before this one is.
  timer_.reset();
}

}  // namespace pdgate
