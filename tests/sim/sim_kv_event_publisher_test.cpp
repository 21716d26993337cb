#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "sim/kv_event_publisher.hpp"

namespace pdgate::sim {
namespace {

using namespace std::chrono_literals;

#ifdef PDGATE_SANITIZED
constexpr auto kWait = 60s;
#else
constexpr auto kWait = 20s;
#endif

KvEventsConfig config(std::size_t max_queue_size = 1000) {
  KvEventsConfig c;
  c.enabled = true;
  c.publisher = "zmq";
  c.endpoint = "tcp://127.0.0.1:*";
  c.topic = "t";
  c.max_queue_size = max_queue_size;
  return c;
}

std::int64_t seq_of(const zmq::message_t& m) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < m.size(); ++i)
    v = (v << 8) | static_cast<const unsigned char*>(m.data())[i];
  return static_cast<std::int64_t>(v);
}

struct Message {
  std::string topic;
  std::size_t seq_size = 0;
  std::int64_t seq = 0;
  std::string payload;
};

// Receives one three-frame message, or returns false after kWait.
bool receive(zmq::socket_t& sub, Message& out) {
  zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, std::chrono::duration_cast<std::chrono::milliseconds>(kWait)) == 0)
    return false;
  zmq::message_t topic, seq, payload;
  if (!sub.recv(topic) || !topic.more() || !sub.recv(seq) || !seq.more() || !sub.recv(payload) ||
      payload.more())
    return false;
  out = {topic.to_string(), seq.size(), seq_of(seq), payload.to_string()};
  return true;
}

// A subscriber only gets what is published after its subscription arrived:
// publish probes until one comes through; returns that probe's seq.
std::int64_t sync(KvEventPublisher& p, zmq::socket_t& sub) {
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (std::chrono::steady_clock::now() < deadline) {
    p.publish("probe");
    zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) > 0) {
      std::int64_t last = -1;
      Message m;
      while (zmq::poll(&item, 1, std::chrono::milliseconds(100)) > 0 && receive(sub, m))
        last = m.seq;
      return last;
    }
  }
  return -1;
}

// Each batch goes out as [topic, 8-byte big-endian seq, payload], seqs consecutive.
TEST(SimKvPublisher, FramesAndConsecutiveSequenceNumbers) {
  std::string error;
  auto p = KvEventPublisher::open(config(), error);
  ASSERT_TRUE(p) << error;
  EXPECT_EQ(p->endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << p->endpoint();
  EXPECT_EQ(p->endpoint().find('*'), std::string::npos);
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "t");
  sub.set(zmq::sockopt::linger, 0);
  sub.connect(p->endpoint());
  const std::int64_t base = sync(*p, sub);
  ASSERT_GE(base, 0);
  const std::vector<std::string> payloads = {"one", std::string(100000, 'x'), ""};
  for (const auto& pl : payloads)
    ASSERT_TRUE(p->publish(pl));
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    Message m;
    ASSERT_TRUE(receive(sub, m)) << "message " << i;
    EXPECT_EQ(m.topic, "t");
    EXPECT_EQ(m.seq_size, 8u);
    EXPECT_EQ(m.seq, base + 1 + static_cast<std::int64_t>(i));
    EXPECT_EQ(m.payload, payloads[i]);
  }
  EXPECT_EQ(p->stats().next_seq, base + 1 + static_cast<std::int64_t>(payloads.size()));
}

// A flood beyond max_queue_size never waits: the excess is dropped and counted, its seqs are
// skipped (so subscribers see gaps), and every other batch is published.
TEST(SimKvPublisher, FullQueueDropsAndCountsWithoutBlocking) {
  std::string error;
  auto p = KvEventPublisher::open(config(1), error);
  ASSERT_TRUE(p) << error;
  constexpr std::uint64_t kBatches = 20000;
  std::uint64_t refused = 0;
  for (std::uint64_t i = 0; i < kBatches; ++i) {
    if (!p->publish(std::string(256, 'p')))
      ++refused;
  }
  // The publisher thread sends a batch far slower than a queue append, so a
  // queue of one overflows many times over.
  EXPECT_GT(refused, 0u);
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  KvEventPublisher::Stats s = p->stats();
  while (s.published + s.dropped < kBatches && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
    s = p->stats();
  }
  EXPECT_EQ(s.dropped, refused);
  EXPECT_EQ(s.published, kBatches - refused);
  EXPECT_EQ(s.next_seq, static_cast<std::int64_t>(kBatches));
}

// An endpoint that cannot be bound is an error naming it, not a crash.
TEST(SimKvPublisher, UnbindableEndpointIsAnError) {
  KvEventsConfig c = config();
  c.endpoint = "tcp://192.0.2.1:*";  // TEST-NET-1: no local interface has it
  std::string error;
  EXPECT_FALSE(KvEventPublisher::open(c, error));
  EXPECT_NE(error.find("tcp://192.0.2.1:*"), std::string::npos) << error;
}

}  // namespace
}  // namespace pdgate::sim
