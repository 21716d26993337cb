// The wake-up a request's load change sends the load-sharing thread
// (core/upstream/load_signal.hpp), and the requests that send it.
#include "core/upstream/load_signal.hpp"

#include <gtest/gtest.h>
#include <poll.h>

#include "core/upstream/instance.hpp"

namespace pdgate {
namespace {

bool woken(const LoadChangeSignal& s) {
  pollfd p{s.fd(), POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

TEST(LoadChangeSignal, WakesTheListenerOnceWhileItWaits) {
  LoadChangeSignal s;
  ASSERT_GE(s.fd(), 0);
  s.notify();  // nobody waits: nothing to wake
  EXPECT_FALSE(woken(s));
  s.arm();
  s.notify();
  EXPECT_TRUE(woken(s));
  s.notify();  // not armed again: one wake-up however many changes
  s.take();
  EXPECT_FALSE(woken(s));
}

TEST(LoadChangeSignal, EveryChangeOfARequestsLoadRingsIt) {
  LoadChangeSignal s;
  UpstreamSpec spec;
  spec.host = "10.0.0.1";
  spec.port = 8000;
  spec.url = "http://10.0.0.1:8000";
  auto inst = std::make_shared<Instance>(1, spec);
  s.arm();
  InFlightGuard g(inst, 500, &s);  // sent
  EXPECT_TRUE(woken(s));
  EXPECT_EQ(inst->in_flight.load(), 1);
  EXPECT_EQ(inst->queued_tokens.load(), 500);
  s.take();
  s.arm();
  g.prompt_done();  // its prompt computed
  EXPECT_TRUE(woken(s));
  EXPECT_EQ(inst->queued_tokens.load(), 0);
  s.take();
  s.arm();
  g.prompt_done();  // nothing changed: no wake-up
  EXPECT_FALSE(woken(s));
  { InFlightGuard ended = std::move(g); }  // ended
  EXPECT_TRUE(woken(s));
  EXPECT_EQ(inst->in_flight.load(), 0);
}

}  // namespace
}  // namespace pdgate
