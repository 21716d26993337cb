#include "plugins/zmq_kv_events.hpp"

#include <spdlog/spdlog.h>

#include <deque>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "core/upstream/instance.hpp"

namespace pdgate {

struct ZmqContext {
  zmq::context_t ctx{1};
};

namespace {

// At most `budget` events in any `window` (times in steady ms): a deque of
// at most `budget` times.
class RateWindow {
 public:
  // Records an event at `now` and says whether it was within budget.
  bool note(std::int64_t now, int budget, std::chrono::milliseconds window) {
    while (!times_.empty() && now - times_.front() >= window.count())
      times_.pop_front();
    if (static_cast<int>(times_.size()) >= budget)
      return false;
    times_.push_back(now);
    return true;
  }
  // Whether one more would be within budget at `now`.
  bool full(std::int64_t now, int budget, std::chrono::milliseconds window) const {
    int recent = 0;
    for (const auto t : times_)
      recent += now - t < window.count();
    return recent >= budget;
  }

 private:
  std::deque<std::int64_t> times_;
};

}  // namespace

// A replay in progress: its own DEALER socket, polled with the feeds.
struct ZmqKvEvents::Replay {
  zmq::socket_t socket;
  std::int64_t next = 0;   // the sequence number wanted next
  std::int64_t until = 0;  // exclusive
  std::int64_t deadline_ms = 0;
  bool whole_history = false;  // a fallback feed's resync
  // The live message that showed the gap: applied once the replay ends.
  std::optional<std::pair<std::int64_t, std::vector<std::uint8_t>>> held;
};

struct ZmqKvEvents::Feed {
  KvEventSubscription sub;
  zmq::socket_t socket;
  std::optional<std::int64_t> last_seq;  // the last sequence number applied
  KvFeedState state = KvFeedState::degraded;
  std::int64_t fallback_retry_ms = 0;  // steady clock: next whole-history replay
  // While set, the stream is not read (ZMQ queues it): its messages come
  // after the ones replayed.
  std::optional<Replay> replay;
  RateWindow replays;
  RateWindow restarts;
  // Steady clock: restarting too often, not trusted before this.
  std::int64_t distrusted_until_ms = 0;
  KvFeedStats stats;
};

namespace {

std::int64_t seq_of(std::span<const std::uint8_t> b) {
  std::uint64_t v = 0;
  for (const std::uint8_t c : b)
    v = (v << 8) | c;
  return static_cast<std::int64_t>(v);
}

std::span<const std::uint8_t> bytes_of(const zmq::message_t& m) {
  return {static_cast<const std::uint8_t*>(m.data()), m.size()};
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

ZmqKvEvents::ZmqKvEvents(std::shared_ptr<KvBlockIndex> index, ZmqKvEventsOptions options)
    : index_(std::move(index)), options_(options), zmq_(std::make_unique<ZmqContext>()) {}

ZmqKvEvents::~ZmqKvEvents() {
  stop();
}

void ZmqKvEvents::start() {
  thread_ = std::thread([this] { run(); });
}

void ZmqKvEvents::stop() {
  stopping_.store(true);
  if (thread_.joinable())
    thread_.join();
}

void ZmqKvEvents::set_subscriptions(std::vector<KvEventSubscription> subs) {
  std::lock_guard lock(pending_mu_);
  pending_ = std::move(subs);
}

void ZmqKvEvents::publish(const Feed& f) {
  KvFeedStats s = f.stats;
  s.state = f.state;
  std::lock_guard lock(stats_mu_);
  stats_[f.sub.key] = std::move(s);
}

std::vector<KvFeedStats> ZmqKvEvents::stats() const {
  std::lock_guard lock(stats_mu_);
  std::vector<KvFeedStats> out;
  for (const auto& [key, s] : stats_)
    out.push_back(s);
  return out;
}

void ZmqKvEvents::sync_subscriptions() {
  std::optional<std::vector<KvEventSubscription>> next;
  {
    std::lock_guard lock(pending_mu_);
    next.swap(pending_);
  }
  if (!next)
    return;
  std::map<InstanceKey, const KvEventSubscription*> wanted;
  for (const auto& s : *next)
    wanted[s.key] = &s;
  // Gone, or its endpoints changed: unsubscribe and forget its blocks.
  for (auto it = feeds_.begin(); it != feeds_.end();) {
    const auto w = wanted.find(it->first);
    if (w != wanted.end() && *w->second == it->second->sub) {
      ++it;
      continue;
    }
    spdlog::info("kv events: unsubscribed from {} ({})", it->second->sub.instance_url,
                 it->second->sub.endpoint.endpoint);
    index_->forget(it->first);
    {
      std::lock_guard lock(stats_mu_);
      stats_.erase(it->first);
    }
    it = feeds_.erase(it);
  }
  for (const auto& [key, s] : wanted) {
    if (feeds_.contains(key))
      continue;
    auto f = std::make_unique<Feed>();
    f->sub = *s;
    f->stats.key = key;
    f->stats.instance_url = s->instance_url;
    try {
      f->socket = zmq::socket_t(zmq_->ctx, zmq::socket_type::sub);
      f->socket.set(zmq::sockopt::linger, 0);
      f->socket.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(options_.limits.max_bytes));
      f->socket.set(zmq::sockopt::rcvhwm, options_.queue_messages);
      f->socket.set(zmq::sockopt::subscribe, "");
      f->socket.connect(s->endpoint.endpoint);
    } catch (const zmq::error_t& e) {
      // The endpoint was checked when configured; a failure here is the
      // system's (out of descriptors): counted as a fallback instance.
      spdlog::error("kv events: cannot subscribe to {} for {}: {}", s->endpoint.endpoint,
                    s->instance_url, e.what());
      f->socket = zmq::socket_t();
      f->state = KvFeedState::fallback;
    }
    index_->clear(key, f->state);
    spdlog::info("kv events: subscribed to {} for {}", s->endpoint.endpoint, s->instance_url);
    publish(*f);
    feeds_.emplace(key, std::move(f));
  }
}

void ZmqKvEvents::fall_back(Feed& f, const char* why) {
  if (f.state != KvFeedState::fallback)
    spdlog::warn("kv events: {} falls back to the approximate index: {}", f.sub.instance_url, why);
  f.state = KvFeedState::fallback;
  f.fallback_retry_ms = steady_now_ms() + options_.resync_interval.count();
  index_->clear(f.sub.key, KvFeedState::fallback);
}

InstanceKey kv_event_source(const KvEventSubscription& feed, const KvEventBatch& /*batch*/) {
  return feed.key;
}

bool ZmqKvEvents::apply(Feed& f, std::span<const std::uint8_t> payload) {
  auto batch = decode_kv_event_batch(payload, options_.limits);
  if (!batch) {
    ++f.stats.decode_errors;
    spdlog::warn("kv events: undecodable batch from {}: {}", f.sub.instance_url, batch.error());
    return false;
  }
  if (f.sub.dp_rank && batch->data_parallel_rank && *batch->data_parallel_rank != *f.sub.dp_rank) {
    // Rank r's socket carrying another rank's blocks: a misconfigured
    // endpoint. Filing them under r would route to blocks r never held.
    ++f.stats.decode_errors;
    spdlog::warn("kv events: {} sent a batch of data-parallel rank {}: not applied",
                 f.sub.instance_url, *batch->data_parallel_rank);
    return false;
  }
  ++f.stats.batches;
  f.stats.events += batch->events.size();
  f.stats.last_ts = batch->ts;
  bool cleared = false;
  const InstanceKey key = kv_event_source(f.sub, *batch);
  for (const auto& e : batch->events) {
    index_->apply(key, e);
    cleared |= std::holds_alternative<KvAllBlocksCleared>(e);
  }
  // An engine that cleared its cache holds exactly what follows: the
  // blocks lost in a gap no longer matter (unless it is not believed).
  if (cleared && f.state == KvFeedState::fallback && steady_now_ms() >= f.distrusted_until_ms) {
    f.state = KvFeedState::exact;
    index_->set_state(f.sub.key, KvFeedState::exact);
    spdlog::info("kv events: {} is exact again (all blocks cleared)", f.sub.instance_url);
  }
  return true;
}

bool ZmqKvEvents::start_replay(
    Feed& f, std::int64_t from, std::int64_t until, bool whole_history,
    std::optional<std::pair<std::int64_t, std::vector<std::uint8_t>>> held) {
  const std::int64_t now = steady_now_ms();
  if (f.sub.endpoint.replay.empty() ||
      !f.replays.note(now, options_.replay_budget, options_.replay_window))
    return false;
  ++f.stats.replays;
  Replay r;
  r.next = from;
  r.until = until;
  r.deadline_ms = now + options_.replay_timeout.count();
  r.whole_history = whole_history;
  r.held = std::move(held);
  try {
    r.socket = zmq::socket_t(zmq_->ctx, zmq::socket_type::dealer);
    r.socket.set(zmq::sockopt::linger, 0);
    r.socket.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(options_.limits.max_bytes));
    r.socket.set(zmq::sockopt::rcvhwm, options_.queue_messages);
    r.socket.connect(f.sub.endpoint.replay);
    std::uint8_t start[8];
    for (int i = 0; i < 8; ++i)
      start[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(from) >> (56 - 8 * i));
    // A DEALER talking to a ROUTER that answers REQ clients: the empty
    // delimiter frame first. Not sent at once (no peer yet) is queued.
    if (!r.socket.send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait) ||
        !r.socket.send(zmq::buffer(start, sizeof start), zmq::send_flags::dontwait)) {
      ++f.stats.replay_failures;
      return false;
    }
  } catch (const zmq::error_t& e) {
    spdlog::warn("kv events: replay from {} failed: {}", f.sub.endpoint.replay, e.what());
    ++f.stats.replay_failures;
    return false;
  }
  f.replay = std::move(r);
  return true;
}

void ZmqKvEvents::receive_replay(Feed& f) {
  // Bounded per round like the stream, so one long replay cannot hold up
  // the other feeds either.
  for (int n = 0; n < 256 && f.replay; ++n) {
    Replay& r = *f.replay;
    std::vector<zmq::message_t> frames;
    std::optional<std::size_t> got;
    try {
      got = zmq::recv_multipart(r.socket, std::back_inserter(frames), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      spdlog::warn("kv events: replay from {} failed: {}", f.sub.endpoint.replay, e.what());
      finish_replay(f, false);
      return;
    }
    if (!got)
      return;
    if (frames.size() == 3 && frames[0].size() == 0)
      frames.erase(frames.begin());
    if (frames.size() != 2 || frames[0].size() != 8) {
      finish_replay(f, false);
      return;
    }
    const std::int64_t seq = seq_of(bytes_of(frames[0]));
    if (seq == -1) {
      finish_replay(f, false);  // the engine has nothing more
      return;
    }
    if (seq < r.next)
      continue;
    // Past `next`: the engine's buffer no longer holds it.
    if (seq > r.next || !apply(f, bytes_of(frames[1]))) {
      finish_replay(f, false);
      return;
    }
    f.last_seq = seq;
    if (++r.next >= r.until) {
      finish_replay(f, true);
      return;
    }
  }
}

void ZmqKvEvents::finish_replay(Feed& f, bool complete) {
  Replay r = std::move(*f.replay);
  f.replay.reset();
  if (!complete)
    ++f.stats.replay_failures;
  if (r.whole_history) {
    if (complete && steady_now_ms() >= f.distrusted_until_ms) {
      f.state = KvFeedState::exact;
      index_->set_state(f.sub.key, KvFeedState::exact);
      spdlog::info("kv events: {} is exact again (whole history replayed)", f.sub.instance_url);
    } else {
      fall_back(f, "its whole history could not be replayed");
      f.last_seq = r.until - 1;
    }
  } else {
    if (!complete)
      fall_back(f, "a gap in sequence numbers could not be replayed");
    if (r.held)
      accept(f, r.held->first, r.held->second);
  }
  publish(f);
}

void ZmqKvEvents::accept(Feed& f, std::int64_t seq, std::span<const std::uint8_t> payload) {
  f.last_seq = seq;
  if (!apply(f, payload)) {
    fall_back(f, "a batch could not be decoded");
    return;
  }
  if (f.state == KvFeedState::degraded) {
    f.state = KvFeedState::exact;
    index_->set_state(f.sub.key, KvFeedState::exact);
  }
}

void ZmqKvEvents::on_message(Feed& f, std::int64_t seq, std::span<const std::uint8_t> payload) {
  const std::int64_t now = steady_now_ms();
  f.stats.last_message_ms = now;
  if (f.last_seq && seq == *f.last_seq)
    return;  // seen already (a replay overlapping the stream)
  if (f.last_seq && seq < *f.last_seq) {
    // Numbers start over: the engine restarted, and its cache with it.
    // Believed a few times a window; past that the engine (or whoever
    // publishes in its name) is not, and stays in fallback.
    ++f.stats.restarts;
    f.last_seq.reset();
    if (!f.restarts.note(now, options_.restart_budget, options_.restart_window)) {
      f.distrusted_until_ms = now + options_.restart_window.count();
      fall_back(f, "its sequence numbers keep going backwards");
    } else {
      spdlog::info("kv events: {} restarted (sequence {})", f.sub.instance_url, seq);
      if (f.state != KvFeedState::fallback || now >= f.distrusted_until_ms)
        f.state = KvFeedState::degraded;
      index_->clear(f.sub.key, f.state);
    }
  }
  const std::int64_t expected = f.last_seq ? *f.last_seq + 1 : 0;
  if (seq != expected) {
    // Missed messages (or joined late): replay them, or the blocks they
    // named cannot be known.
    ++f.stats.gaps;
    if (f.state == KvFeedState::exact)
      f.state = KvFeedState::degraded;
    index_->set_state(f.sub.key, f.state);
    if (!f.last_seq)
      index_->clear(f.sub.key, f.state);
    if (f.state != KvFeedState::fallback) {
      if (start_replay(f, expected, seq, false,
                       std::pair{seq, std::vector<std::uint8_t>(payload.begin(), payload.end())}))
        return;  // continued in finish_replay()
      fall_back(f, f.sub.endpoint.replay.empty()
                       ? "a gap in sequence numbers and no replay endpoint"
                       : "a gap in sequence numbers and its replay budget spent");
    }
  }
  accept(f, seq, payload);
}

void ZmqKvEvents::receive(Feed& f) {
  // A bounded number per round, so one busy engine cannot starve others;
  // none once a replay starts (the rest wait for it, queued).
  for (int n = 0; n < 256 && !f.replay; ++n) {
    std::vector<zmq::message_t> frames;
    std::optional<std::size_t> got;
    try {
      got = zmq::recv_multipart(f.socket, std::back_inserter(frames), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      spdlog::warn("kv events: receive from {} failed: {}", f.sub.instance_url, e.what());
      return;
    }
    if (!got)
      return;
    if (frames.size() != 3 || frames[1].size() != 8) {
      ++f.stats.decode_errors;
      fall_back(f, "a message was not [topic, seq, payload]");
    } else {
      on_message(f, seq_of(bytes_of(frames[1])), bytes_of(frames[2]));
    }
    publish(f);
  }
}

void ZmqKvEvents::run() {
  while (!stopping_.load(std::memory_order_relaxed)) {
    sync_subscriptions();
    // Each feed's stream, or its replay while one runs; the poll waits no
    // longer than the nearest replay deadline.
    std::vector<zmq::pollitem_t> items;
    std::vector<Feed*> polled;
    std::int64_t now = steady_now_ms();
    auto wait = options_.poll_interval;
    for (auto& [key, f] : feeds_) {
      if (f->replay) {
        items.push_back({f->replay->socket.handle(), 0, ZMQ_POLLIN, 0});
        wait = std::min(wait, std::chrono::milliseconds(
                                  std::max<std::int64_t>(0, f->replay->deadline_ms - now)));
      } else if (f->socket) {
        items.push_back({f->socket.handle(), 0, ZMQ_POLLIN, 0});
      } else {
        continue;
      }
      polled.push_back(f.get());
    }
    try {
      if (items.empty()) {
        std::this_thread::sleep_for(options_.poll_interval);
        continue;
      }
      zmq::poll(items, wait);
    } catch (const zmq::error_t& e) {
      spdlog::warn("kv events: poll failed: {}", e.what());
      std::this_thread::sleep_for(options_.poll_interval);
      continue;
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN))
        continue;
      Feed& f = *polled[i];
      if (f.replay)
        receive_replay(f);
      else
        receive(f);
    }
    now = steady_now_ms();
    for (auto& [key, f] : feeds_) {
      if (f->replay && now >= f->replay->deadline_ms) {
        spdlog::warn("kv events: replay from {} timed out", f->sub.endpoint.replay);
        finish_replay(*f, false);
      }
    }
    // Fallback instances ask for their whole history now and then: an
    // engine whose replay buffer still starts at sequence 0 makes it exact.
    for (auto& [key, f] : feeds_) {
      if (f->state != KvFeedState::fallback || f->replay || !f->last_seq ||
          f->sub.endpoint.replay.empty() || now < f->fallback_retry_ms ||
          now < f->distrusted_until_ms)
        continue;
      const std::int64_t until = *f->last_seq + 1;
      f->fallback_retry_ms = now + options_.resync_interval.count();
      if (f->replays.full(now, options_.replay_budget, options_.replay_window))
        continue;
      index_->clear(key, KvFeedState::fallback);
      f->last_seq.reset();
      if (!start_replay(*f, 0, until, true, std::nullopt))
        f->last_seq = until - 1;
      publish(*f);
    }
  }
  feeds_.clear();
}

void ZmqKvEvents::write_metrics(PrometheusText& m) const {
  const auto rows = stats();
  const double now_wall = wall_seconds();
  const std::int64_t now = steady_now_ms();
  const auto each = [&](const char* name, const char* type, const char* help, auto value) {
    if (std::string_view(type) == "counter")
      m.counter(name, help);
    else
      m.gauge(name, help);
    for (const auto& r : rows)
      m.sample(name, {{"instance", r.instance_url}}, value(r));
  };
  each("pdgate_kv_events_batches_total", "counter", "KV event batches received and decoded.",
       [](const KvFeedStats& r) { return r.batches; });
  each("pdgate_kv_events_total", "counter", "KV events received (stored, removed, cleared).",
       [](const KvFeedStats& r) { return r.events; });
  each("pdgate_kv_events_decode_errors_total", "counter",
       "KV event messages that could not be decoded.",
       [](const KvFeedStats& r) { return r.decode_errors; });
  each("pdgate_kv_events_gaps_total", "counter", "Gaps in KV event sequence numbers.",
       [](const KvFeedStats& r) { return r.gaps; });
  each("pdgate_kv_events_replays_total", "counter", "Replays asked of the engine's replay socket.",
       [](const KvFeedStats& r) { return r.replays; });
  each("pdgate_kv_events_replay_failures_total", "counter",
       "Replays that did not deliver every missing message in time.",
       [](const KvFeedStats& r) { return r.replay_failures; });
  each("pdgate_kv_events_restarts_total", "counter",
       "Times an instance's sequence numbers started over (an engine restart).",
       [](const KvFeedStats& r) { return r.restarts; });
  each("pdgate_kv_events_freshness_seconds", "gauge",
       "Age of the last KV event message received (-1: none yet).", [&](const KvFeedStats& r) {
         return r.last_message_ms == 0 ? -1.0 : static_cast<double>(now - r.last_message_ms) / 1e3;
       });
  each("pdgate_kv_events_lag_seconds", "gauge",
       "Gateway clock minus the engine's timestamp of the last batch (-1: none yet).",
       [&](const KvFeedStats& r) { return r.last_ts == 0 ? -1.0 : now_wall - r.last_ts; });
  m.gauge("pdgate_kv_events_state",
          "1 for the state of each instance's KV event feed: exact, degraded or fallback.");
  for (const auto& r : rows) {
    for (const auto s : {KvFeedState::exact, KvFeedState::degraded, KvFeedState::fallback})
      m.sample("pdgate_kv_events_state", {{"instance", r.instance_url}, {"state", to_string(s)}},
               std::uint64_t{r.state == s});
  }
  const auto blocks = index_->instances();
  m.gauge("pdgate_kv_index_blocks", "Blocks the exact KV index holds per instance.");
  for (const auto& b : blocks) {
    for (const auto& r : rows) {
      if (r.key == b.key)
        m.sample("pdgate_kv_index_blocks", {{"instance", r.instance_url}}, std::uint64_t{b.blocks});
    }
  }
  m.counter("pdgate_kv_index_ignored_blocks_total",
            "Stored blocks not indexed by design: of a KV-cache group that is not full attention "
            "(reason=group), or on a medium other than the engine's GPU or CPU (reason=medium).");
  for (const auto& b : blocks) {
    for (const auto& r : rows) {
      if (r.key != b.key)
        continue;
      m.sample("pdgate_kv_index_ignored_blocks_total",
               {{"instance", r.instance_url}, {"reason", "group"}}, b.ignored_group);
      m.sample("pdgate_kv_index_ignored_blocks_total",
               {{"instance", r.instance_url}, {"reason", "medium"}}, b.ignored_medium);
    }
  }
  m.counter("pdgate_kv_index_dropped_blocks_total",
            "Blocks not kept: over the per-instance or total cap, or with an unknown parent.");
  m.sample("pdgate_kv_index_dropped_blocks_total", index_->dropped_total());
}

}  // namespace pdgate
