#include "policies/kv_index_purge.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace pdgate::policy {

namespace net = boost::asio;

std::size_t InstancePurger::sweep(const InstanceSet& set, KvLocationIndex& index,
                                  std::int64_t now_ms) {
  std::unordered_set<InstanceKey> now;
  now.reserve(set.by_id.size());
  for (const auto& inst : set.by_id)
    now.insert(instance_key(inst->location));
  std::size_t gone = 0;
  for (const InstanceKey k : known_) {
    if (now.count(k) == 0) {
      index.forget_instance(k, now_ms);
      ++gone;
    }
  }
  known_ = std::move(now);
  return gone;
}

namespace {

net::awaitable<void> purge_loop(const Registry& registry, std::shared_ptr<KvLocationIndex> index,
                                std::chrono::milliseconds interval) {
  InstancePurger purger;
  net::steady_timer timer(co_await net::this_coro::executor);
  for (;;) {
    purger.sweep(*registry.snapshot(), *index, steady_now_ms());
    timer.expires_after(interval);
    auto [ec] = co_await timer.async_wait(net::as_tuple(net::use_awaitable));
    if (ec)
      co_return;
  }
}

}  // namespace

void start_kv_index_purge(net::io_context& ioc, const Registry& registry,
                          std::shared_ptr<KvLocationIndex> index,
                          std::chrono::milliseconds interval) {
  net::co_spawn(ioc, purge_loop(registry, std::move(index), interval), net::detached);
}

}  // namespace pdgate::policy
