#include "plugins/redis_kv_index.hpp"

#include <algorithm>
#include <limits>
#include <random>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "core/base/clock.hpp"
#include "plugins/redis_connection.hpp"

namespace pdgate {
namespace {

using Type = RedisReply::Type;

net::awaitable<void> sleep_for(std::chrono::milliseconds d) {
  net::steady_timer t(co_await net::this_coro::executor);
  t.expires_after(d);
  co_await t.async_wait(net::as_tuple(net::use_awaitable));
}

}  // namespace

RedisKvIndex::RedisKvIndex(std::shared_ptr<KvLocationIndex> local, RedisKvIndexSettings settings)
    : local_(std::move(local)),
      settings_(std::move(settings)),
      origin_(random_origin()),
      shared_(std::make_unique<RedisConnectionsShared>()) {}

RedisKvIndex::~RedisKvIndex() {
  stop();
}

Result<bool> RedisKvIndex::start() {
  auto endpoint = parse_redis_url(settings_.redis_url);
  if (!endpoint)
    return fail(endpoint.error());
  RedisConnectionSettings w;
  w.endpoint = *endpoint;
  w.context = settings_.redis;
  w.command_timeout = settings_.command_timeout;
  RedisConnectionSettings r = w;
  // The reader's command is a blocking XREAD: its reply may take the whole
  // block time.
  r.command_timeout = settings_.read_block + settings_.command_timeout;
  writer_ = RedisConnection::create(ioc_.get_executor(), w, *shared_);
  reader_ = RedisConnection::create(ioc_.get_executor(), r, *shared_);
  wake_ = std::make_unique<net::steady_timer>(ioc_);
  writer_->start();
  reader_->start();
  net::co_spawn(ioc_, publish_loop(), net::detached);
  net::co_spawn(ioc_, read_loop(), net::detached);
  thread_ = std::thread([this] { ioc_.run(); });
  return true;
}

void RedisKvIndex::stop() {
  if (!thread_.joinable())
    return;
  stopping_ = true;
  net::post(ioc_, [this] {
    writer_->stop();
    reader_->stop();
    ioc_.stop();
  });
  thread_.join();
}

template <typename Encode>
void RedisKvIndex::enqueue(Encode&& encode) {
  // Encoded before taking the lock: workers share it.
  std::string rec;
  encode(rec);
  bool post = false;
  {
    std::lock_guard lock(mu_);
    if (open_.records > 0 && open_.body.size() + rec.size() > settings_.batch_bytes) {
      sealed_.push_back(std::move(open_));
      open_ = Pending{};
      open_.body.reserve(settings_.batch_bytes);
    }
    // Over the bound: the oldest batch goes (newer routes are worth more).
    while (queued_bytes_ + rec.size() > settings_.max_queued_bytes && !sealed_.empty()) {
      queued_bytes_ -= sealed_.front().body.size();
      stats_.dropped.fetch_add(sealed_.front().records, std::memory_order_relaxed);
      sealed_.pop_front();
    }
    if (queued_bytes_ + rec.size() > settings_.max_queued_bytes) {
      stats_.dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    open_.body += rec;
    open_.records += 1;
    queued_bytes_ += rec.size();
    stats_.queued_bytes.store(queued_bytes_, std::memory_order_relaxed);
    // One wake-up outstanding at most (before start() it waits in ioc_).
    post = !wake_posted_;
    wake_posted_ = true;
  }
  if (post)
    net::post(ioc_, [this] { wake_->cancel(); });
}

void RedisKvIndex::record_prefix(const std::vector<std::uint64_t>& hashes, InstanceKey where,
                                 std::int64_t now_ms) {
  local_->record_prefix(hashes, where, now_ms);
  if (hashes.empty() || where == 0)
    return;
  const std::int64_t wall = wall_now_ms();
  enqueue([&](std::string& out) { kv_wire::append_prefix(out, where, wall, hashes); });
}

void RedisKvIndex::record_conversation(std::string_view id, const ConversationRoute& route) {
  local_->record_conversation(id, route);
  if (id.size() > kv_wire::kMaxConversationId)
    return;  // cut short it would name another conversation
  const std::int64_t wall = wall_now_ms();
  enqueue([&](std::string& out) {
    kv_wire::append_conversation(out, id, route.decode, route.prefill, wall);
  });
}

void RedisKvIndex::apply(const kv_wire::Batch& batch, std::int64_t wall_now,
                         std::int64_t steady_now) {
  if (batch.origin == origin_)
    return;
  std::int64_t newest = std::numeric_limits<std::int64_t>::min();
  // A record's steady time here: now minus its age (clamped at 0 when the
  // other machine's clock runs ahead).
  const auto local_time = [&](std::int64_t wall_ms) -> std::optional<std::int64_t> {
    const std::int64_t age = wall_now - wall_ms;
    if (age > settings_.ttl_ms)
      return std::nullopt;
    newest = std::max(newest, wall_ms);
    return steady_now - std::max<std::int64_t>(age, 0);
  };
  std::uint64_t n = 0;
  for (const auto& p : batch.prefixes) {
    if (const auto at = local_time(p.wall_ms); at && p.instance != 0) {
      local_->record_prefix(p.hashes, p.instance, *at);
      ++n;
    }
  }
  for (const auto& c : batch.conversations) {
    const auto at = local_time(c.wall_ms);
    if (!at)
      continue;
    // A late record must not replace a newer turn's route.
    if (const auto cur = local_->conversation(c.id); cur && cur->at_ms > *at)
      continue;
    local_->record_conversation(c.id, ConversationRoute{c.decode, c.prefill, *at});
    ++n;
  }
  stats_.applied.fetch_add(n, std::memory_order_relaxed);
  if (newest != std::numeric_limits<std::int64_t>::min())
    stats_.lag_ms.store(std::max<std::int64_t>(wall_now - newest, 0), std::memory_order_relaxed);
}

net::awaitable<void> RedisKvIndex::publish_loop() {
  // Named strings: GCC 12 miscompiles braced lists of literals in co_await.
  const std::string xadd = "XADD", maxlen = "MAXLEN", approx = "~", auto_id = "*", field = "b";
  const std::string max_batches = std::to_string(settings_.stream_max_batches);
  const std::string head = kv_wire::header(origin_);
  // Starts as failing: until the first write there is nothing to say (the
  // connection logs its own trouble).
  bool failing = true, written = false;
  while (!stopping_) {
    Pending batch;
    {
      std::lock_guard lock(mu_);
      if (sealed_.empty() && open_.records > 0) {
        sealed_.push_back(std::move(open_));
        open_ = Pending{};
      }
      if (!sealed_.empty()) {
        batch = std::move(sealed_.front());
        sealed_.pop_front();
        queued_bytes_ -= batch.body.size();
      } else {
        wake_posted_ = false;
      }
      stats_.queued_bytes.store(queued_bytes_, std::memory_order_relaxed);
    }
    if (batch.records == 0) {
      // Idle until a record arrives (enqueue cancels the wait), then give
      // the records of the next few milliseconds a chance to join it.
      wake_->expires_after(std::chrono::hours(1));
      co_await wake_->async_wait(net::as_tuple(net::use_awaitable));
      if (!stopping_)
        co_await sleep_for(settings_.batch_window);
      continue;
    }
    const std::string payload = head + batch.body;
    std::vector<std::string_view> args;
    args.emplace_back(xadd);
    args.emplace_back(settings_.stream_key);
    args.emplace_back(maxlen);
    args.emplace_back(approx);
    args.emplace_back(max_batches);
    args.emplace_back(auto_id);
    args.emplace_back(field);
    args.emplace_back(payload);
    const RedisReply r = co_await writer_->command(std::move(args));
    if (r.type == Type::string) {
      stats_.published.fetch_add(batch.records, std::memory_order_relaxed);
      if (failing && written)
        spdlog::info("shared kv index: publishing to Redis again");
      failing = false;
      written = true;
      continue;
    }
    if (!failing) {
      spdlog::warn("shared kv index: cannot publish to Redis ({}); routing records are queued",
                   r.text);
    }
    failing = true;
    {
      // Back at the front, unless newer records filled the queue meanwhile.
      std::lock_guard lock(mu_);
      if (queued_bytes_ + batch.body.size() <= settings_.max_queued_bytes) {
        queued_bytes_ += batch.body.size();
        sealed_.push_front(std::move(batch));
      } else {
        stats_.dropped.fetch_add(batch.records, std::memory_order_relaxed);
      }
    }
    co_await sleep_for(settings_.retry_interval);
  }
}

net::awaitable<void> RedisKvIndex::read_loop() {
  const std::string xread = "XREAD", count_kw = "COUNT", count = "64", block_kw = "BLOCK",
                    streams = "STREAMS";
  const std::string block = std::to_string(settings_.read_block.count());
  // From the start of what the stream retains: a replica that starts (or a
  // Redis that restarted) is caught up on the recent routing.
  std::string last = "0-0";
  bool failing = true;  // as in publish_loop: quiet until a first read
  while (!stopping_) {
    std::vector<std::string_view> args;
    args.emplace_back(xread);
    args.emplace_back(count_kw);
    args.emplace_back(count);
    args.emplace_back(block_kw);
    args.emplace_back(block);
    args.emplace_back(streams);
    args.emplace_back(settings_.stream_key);
    args.emplace_back(last);
    const RedisReply r = co_await reader_->command(std::move(args));
    auto entries = kv_wire::parse_xread(r, "b");
    if (r.type == Type::none || !entries) {
      if (!failing && !stopping_) {
        spdlog::warn(
            "shared kv index: cannot read from Redis ({}); routing on what this "
            "replica knows",
            entries ? r.text : entries.error());
      }
      failing = true;
      co_await sleep_for(settings_.retry_interval);
      continue;
    }
    failing = false;
    const std::int64_t wall = wall_now_ms(), steady = steady_now_ms();
    for (const auto& e : *entries) {
      last = e.id;
      auto batch = kv_wire::decode_batch(e.payload);
      if (!batch) {
        stats_.rejected.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      apply(*batch, wall, steady);
    }
  }
}

void write_kv_index_metrics(PrometheusText& m, const KvIndexStats& s) {
  m.counter("pdgate_kv_index_records_total",
            "Routing records of the shared KV-location index: published to Redis, applied "
            "from other replicas, dropped (queue full while Redis was slow or down), "
            "rejected (malformed batches).");
  const std::pair<const char*, std::uint64_t> rows[] = {
      {"published", s.published.load()},
      {"applied", s.applied.load()},
      {"dropped", s.dropped.load()},
      {"rejected", s.rejected.load()},
  };
  for (const auto& [kind, n] : rows)
    m.sample("pdgate_kv_index_records_total", {{"kind", kind}}, n);
  m.gauge("pdgate_kv_index_lag_ms",
          "Age of the newest record of the last batch applied from another replica, when it "
          "was applied.");
  m.sample("pdgate_kv_index_lag_ms", std::int64_t{s.lag_ms.load()});
  m.gauge("pdgate_kv_index_queued_bytes", "Routing records waiting to be published.");
  m.sample("pdgate_kv_index_queued_bytes", std::uint64_t{s.queued_bytes.load()});
}

}  // namespace pdgate
