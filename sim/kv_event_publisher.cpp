#include "sim/kv_event_publisher.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cstring>

namespace pdgate::sim {

namespace {

// A replay request is [identity, "", start_seq]: a few bytes. Anything larger
// is refused by libzmq before it reaches us.
constexpr std::int64_t kMaxReplayFrameBytes = 1024;
constexpr std::size_t kMaxReplayFrames = 8;

std::string seq_bytes(std::int64_t seq) {
  std::string out(8, '\0');
  const auto u = static_cast<std::uint64_t>(seq);
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((u >> (8 * (7 - i))) & 0xff);
  return out;
}

void open_endpoint(zmq::socket_t& s, const std::string& endpoint, bool bind) {
  if (bind) {
    s.bind(endpoint);
  } else {
    s.connect(endpoint);
  }
}

}  // namespace

KvEventPublisher::KvEventPublisher(const KvEventsConfig& config)
    : config_(config), pub_(context_, zmq::socket_type::pub) {}

std::unique_ptr<KvEventPublisher> KvEventPublisher::open(const KvEventsConfig& config,
                                                         std::string& error) {
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(config));
  const std::string* opening = &config.endpoint;
  try {
    p->pub_.set(zmq::sockopt::sndhwm, config.hwm);
    // Unsent batches are not worth delaying the sim's exit for.
    p->pub_.set(zmq::sockopt::linger, 0);
    const bool bind = endpoint_binds(config.endpoint);
    open_endpoint(p->pub_, config.endpoint, bind);
    p->endpoint_ = bind ? p->pub_.get(zmq::sockopt::last_endpoint) : config.endpoint;
    if (!config.replay_endpoint.empty()) {
      p->replay_ = zmq::socket_t(p->context_, zmq::socket_type::router);
      p->replay_.set(zmq::sockopt::linger, 0);
      p->replay_.set(zmq::sockopt::maxmsgsize, kMaxReplayFrameBytes);
      opening = &config.replay_endpoint;
      // vLLM always binds the replay socket.
      p->replay_.bind(config.replay_endpoint);
      p->replay_endpoint_ = p->replay_.get(zmq::sockopt::last_endpoint);
    }
  } catch (const zmq::error_t& e) {
    error = "cannot open the KV event socket " + *opening + ": " + e.what();
    return nullptr;
  }
  p->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->wake_fd_ < 0) {
    error = std::string("eventfd: ") + std::strerror(errno);
    return nullptr;
  }
  p->thread_ = std::thread([raw = p.get()] { raw->run(); });
  return p;
}

KvEventPublisher::~KvEventPublisher() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  if (wake_fd_ >= 0)
    ::close(wake_fd_);
}

bool KvEventPublisher::publish(std::string payload) {
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    const std::int64_t seq = next_seq_++;
    if (queue_.size() >= config_.max_queue_size) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    wake = queue_.empty();
    queue_.emplace_back(seq, std::move(payload));
  }
  if (wake) {
    // An eventfd write never blocks while its counter is far from 2^64.
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
  }
  return true;
}

KvEventPublisher::Stats KvEventPublisher::stats() const {
  Stats s;
  s.published = published_.load(std::memory_order_relaxed);
  s.dropped = dropped_.load(std::memory_order_relaxed);
  s.replays = replays_.load(std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  s.next_seq = next_seq_;
  return s;
}

void KvEventPublisher::send_batch(std::int64_t seq, const std::string& payload) {
  // PUB sends never block: past the high-water mark libzmq drops, as it
  // does for vLLM.
  const std::string seq_frame = seq_bytes(seq);
  pub_.send(zmq::buffer(config_.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  pub_.send(zmq::buffer(seq_frame), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  pub_.send(zmq::buffer(payload), zmq::send_flags::dontwait);
  published_.fetch_add(1, std::memory_order_relaxed);
  buffer_.emplace_back(seq, payload);
  while (buffer_.size() > config_.buffer_steps)
    buffer_.pop_front();
}

void KvEventPublisher::serve_replay() {
  std::array<zmq::message_t, kMaxReplayFrames> frames;
  std::size_t n = 0;
  bool more = true;
  while (more) {
    zmq::message_t m;
    if (!replay_.recv(m, zmq::recv_flags::dontwait))
      return;
    more = m.more();
    if (n < frames.size())
      frames[n] = std::move(m);
    ++n;  // frames beyond the array are read and dropped
  }
  // [identity, "", start_seq (8 bytes, big-endian)], as vLLM reads it.
  if (n != 3 || frames[1].size() != 0 || frames[2].size() != 8)
    return;
  std::uint64_t start = 0;
  const auto* b = static_cast<const unsigned char*>(frames[2].data());
  for (int i = 0; i < 8; ++i)
    start = (start << 8) | b[i];
  const std::string identity = frames[0].to_string();
  auto reply = [&](const std::string& seq, const std::string& payload) {
    replay_.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    replay_.send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    replay_.send(zmq::buffer(seq), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    replay_.send(zmq::buffer(payload), zmq::send_flags::dontwait);
  };
  for (const auto& [seq, payload] : buffer_) {
    if (static_cast<std::uint64_t>(seq) >= start)
      reply(seq_bytes(seq), payload);
  }
  reply(seq_bytes(-1), std::string());
  replays_.fetch_add(1, std::memory_order_relaxed);
}

void KvEventPublisher::run() {
  std::array<zmq::pollitem_t, 2> items{};
  items[0].fd = wake_fd_;
  items[0].events = ZMQ_POLLIN;
  const bool with_replay = static_cast<bool>(replay_);
  if (with_replay) {
    items[1].socket = replay_.handle();
    items[1].events = ZMQ_POLLIN;
  }
  std::deque<std::pair<std::int64_t, std::string>> batch;
  for (;;) {
    try {
      zmq::poll(items.data(), with_replay ? 2 : 1, std::chrono::milliseconds(-1));
    } catch (const zmq::error_t&) {
      continue;  // EINTR
    }
    if (items[0].revents & ZMQ_POLLIN) {
      std::uint64_t count = 0;
      [[maybe_unused]] auto n = ::read(wake_fd_, &count, sizeof count);
    }
    bool stop = false;
    {
      std::lock_guard lock(mutex_);
      batch.swap(queue_);
      stop = stop_;
    }
    for (const auto& [seq, payload] : batch)
      send_batch(seq, payload);
    batch.clear();
    if (stop)
      return;
    if (with_replay && (items[1].revents & ZMQ_POLLIN)) {
      // Several requests may be pending: serve them all before polling again.
      while (replay_.get(zmq::sockopt::events) & ZMQ_POLLIN)
        serve_replay();
    }
  }
}

}  // namespace pdgate::sim
