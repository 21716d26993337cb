#include "policies/metrics.hpp"

#include "core/upstream/health.hpp"
#include "core/upstream/probe_rounds.hpp"

#include <cmath>
#include <memory>
#include <string>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/this_coro.hpp>

namespace pdgate::policy {

namespace net = boost::asio;

void store_metrics(const Instance& inst, const EngineMetrics& m, std::int64_t now_ms) {
  if (m.running)
    inst.engine_running.store(std::llround(*m.running), std::memory_order_relaxed);
  if (m.waiting)
    inst.engine_waiting.store(std::llround(*m.waiting), std::memory_order_relaxed);
  if (m.kv_usage)
    inst.kv_cache_usage.store(*m.kv_usage, std::memory_order_relaxed);
  const std::int64_t engine_load = inst.engine_running.load(std::memory_order_relaxed) +
                                   inst.engine_waiting.load(std::memory_order_relaxed);
  // What every replica reported in flight there is counted live; the rest
  // of what the engine holds came around pdgate.
  inst.engine_other_load.store(std::max<std::int64_t>(0, engine_load - inst.cluster_in_flight()),
                               std::memory_order_relaxed);
  inst.metrics_at_ms.store(now_ms, std::memory_order_relaxed);
}

namespace {

// One GET /metrics; any failure leaves the instance's numbers as they were.
// vLLM's /metrics is tens of KiB; the bound keeps a confused peer from
// growing our memory.
net::awaitable<void> scrape_one(InstancePtr inst, std::chrono::milliseconds timeout,
                                const EngineTls* tls) {
  auto ex = co_await net::this_coro::executor;
  auto r = co_await probe_get(ex, inst->spec.host, inst->spec.port, "/metrics", timeout, {},
                              inst->spec.tls ? tls : nullptr, 8u << 20);
  if (r.status == 200)
    store_metrics(*inst, parse_vllm_metrics(r.body, inst->spec.dp_rank), steady_now_ms());
}

}  // namespace

void start_metrics_scraper(boost::asio::io_context& ioc, const Registry& registry,
                           std::chrono::milliseconds interval, std::size_t max_concurrency,
                           std::shared_ptr<const EngineTls> tls) {
  const auto timeout = std::max(interval, std::chrono::milliseconds(200));
  ProbeRounds rounds;
  // Draining instances take no new requests: their load no longer matters.
  rounds.instances = [&registry] {
    const auto set = registry.snapshot();
    std::vector<InstancePtr> out;
    out.reserve(set->by_id.size());
    for (const auto& inst : set->by_id) {
      if (!inst->draining.load(std::memory_order_relaxed))
        out.push_back(inst);
    }
    return out;
  };
  rounds.probe = [timeout, tls](InstancePtr inst) {
    return scrape_one(std::move(inst), timeout, tls.get());
  };
  rounds.interval = interval;
  rounds.max_concurrency = max_concurrency;
  net::co_spawn(ioc, run_probe_rounds(std::move(rounds)), net::detached);
}

}  // namespace pdgate::policy
