#include "core/upstream/kv_event_follow.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace pdgate {

namespace net = boost::asio;

std::vector<KvEventSubscription> kv_event_subscriptions(const InstanceSet& set) {
  std::vector<KvEventSubscription> out;
  for (const auto& inst : set.by_id) {
    if (inst->spec.kv_events.endpoint.empty())
      continue;
    // By location: each data-parallel rank has its own feed (its own
    // endpoint) and its own blocks in the index.
    KvEventSubscription sub{instance_key(inst->location), inst->location, inst->spec.kv_events,
                            std::nullopt};
    if (inst->spec.dp_rank)
      sub.dp_rank = *inst->spec.dp_rank;
    out.push_back(std::move(sub));
  }
  return out;
}

namespace {

net::awaitable<void> follow_loop(const Registry& registry, std::shared_ptr<KvEventIngest> ingest,
                                 std::chrono::milliseconds interval) {
  net::steady_timer timer(co_await net::this_coro::executor);
  std::shared_ptr<const InstanceSet> seen;
  for (;;) {
    // A new snapshot is made for every registry change; the same one means
    // nothing changed.
    auto now = registry.snapshot();
    if (now != seen) {
      ingest->set_subscriptions(kv_event_subscriptions(*now));
      seen = std::move(now);
    }
    timer.expires_after(interval);
    auto [ec] = co_await timer.async_wait(net::as_tuple(net::use_awaitable));
    if (ec)
      co_return;
  }
}

}  // namespace

void start_kv_event_follow(net::io_context& ioc, const Registry& registry,
                           std::shared_ptr<KvEventIngest> ingest,
                           std::chrono::milliseconds interval) {
  net::co_spawn(ioc, follow_loop(registry, std::move(ingest), interval), net::detached);
}

}  // namespace pdgate
