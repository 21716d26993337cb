#include "policies/metrics.hpp"

#include "core/upstream/health.hpp"
#include "core/upstream/probe_rounds.hpp"

#include <charconv>
#include <cmath>
#include <memory>
#include <string>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/this_coro.hpp>

namespace pdgate::policy {
namespace {

namespace net = boost::asio;

struct Sum {
  double total = 0;
  int count = 0;
};

// Parses a Prometheus sample value ("3", "3.0", "1e-3", "NaN", "+Inf").
std::optional<double> parse_value(std::string_view v) {
  double d = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (ec != std::errc() || ptr != v.data() + v.size() || !std::isfinite(d))
    return std::nullopt;
  return d;
}

}  // namespace

EngineMetrics parse_vllm_metrics(std::string_view text) {
  Sum running, waiting, kv, kv_old;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos)
      eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r')
      line.remove_suffix(1);
    if (line.empty() || line.front() == '#')
      continue;
    // name{labels} value [timestamp]; label values may hold spaces or
    // braces inside quotes, so the name ends at '{' or ' ' and the labels
    // at the last '}'.
    const std::size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos)
      continue;
    const std::string_view name = line.substr(0, name_end);
    Sum* target = nullptr;
    if (name == "vllm:num_requests_running")
      target = &running;
    else if (name == "vllm:num_requests_waiting")
      target = &waiting;
    else if (name == "vllm:kv_cache_usage_perc")
      target = &kv;
    else if (name == "vllm:gpu_cache_usage_perc")
      target = &kv_old;
    if (target == nullptr)
      continue;
    std::string_view rest = line.substr(name_end);
    if (rest.front() == '{') {
      const std::size_t close = rest.rfind('}');
      if (close == std::string_view::npos)
        continue;
      rest = rest.substr(close + 1);
    }
    while (!rest.empty() && rest.front() == ' ')
      rest.remove_prefix(1);
    const std::size_t sp = rest.find(' ');
    if (sp != std::string_view::npos)
      rest = rest.substr(0, sp);  // drop the timestamp
    auto v = parse_value(rest);
    if (!v)
      continue;
    target->total += *v;
    ++target->count;
  }
  EngineMetrics m;
  if (running.count > 0)
    m.running = running.total;
  if (waiting.count > 0)
    m.waiting = waiting.total;
  const Sum& k = kv.count > 0 ? kv : kv_old;
  if (k.count > 0)
    m.kv_usage = k.total / k.count;
  return m;
}

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
    store_metrics(*inst, parse_vllm_metrics(r.body), steady_now_ms());
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
