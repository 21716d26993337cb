// How long a routing record takes to reach another replica through the
// shared KV-location index (plugins/redis_kv_index.hpp): two indexes in
// one process over a real Redis, replica A records prompts at a steady
// rate, replica B is polled until each one is visible. Prints the
// propagation time's percentiles and the indexes' counters.
//
//   redis-server --port 6399 --save '' &
//   build-bench/bench/kv_index_bench --redis redis://127.0.0.1:6399 --rate 1000 --records 5000
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "plugins/redis_kv_index.hpp"
#include "policies/local_kv_index.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

double us(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string url;
  int records = 5000, rate = 1000, blocks = 64, batch_kib = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--redis")
      url = argv[i + 1];
    else if (k == "--records")
      records = std::atoi(argv[i + 1]);
    else if (k == "--rate")
      rate = std::atoi(argv[i + 1]);
    else if (k == "--blocks")
      blocks = std::atoi(argv[i + 1]);
    else if (k == "--batch-kib")
      batch_kib = std::atoi(argv[i + 1]);
  }
  if (url.empty() || records <= 0 || rate <= 0 || blocks <= 0) {
    std::fprintf(stderr,
                 "usage: kv_index_bench --redis URL [--records N] [--rate PER_S] [--blocks N]\n");
    return 2;
  }
  pdgate::RedisKvIndexSettings s;
  s.redis_url = url;
  s.batch_bytes = static_cast<std::size_t>(std::max(batch_kib, 1)) << 10;
  s.stream_key = "pdgate-bench:kv-index:" + std::to_string(::getpid());
  auto make = [&] {
    return std::make_unique<pdgate::RedisKvIndex>(std::make_shared<pdgate::policy::LocalKvIndex>(),
                                                  s);
  };
  auto a = make(), b = make();
  if (!a->start() || !b->start()) {
    std::fprintf(stderr, "kv_index_bench: bad Redis URL %s\n", url.c_str());
    return 2;
  }
  const pdgate::InstanceKey where = pdgate::instance_key("http://10.0.0.1:8100");
  auto prompt = [&](int i) {
    // Distinct chained-looking hashes per record; the last one identifies it.
    std::vector<std::uint64_t> h(static_cast<std::size_t>(blocks));
    for (int k = 0; k < blocks; ++k)
      h[static_cast<std::size_t>(k)] = (std::uint64_t(i) << 20) + std::uint64_t(k) + 1;
    return h;
  };
  // Both connected: a first record makes the round trip.
  a->record_prefix(prompt(-1), where, steady_ms());
  const auto warm_deadline = Clock::now() + std::chrono::seconds(10);
  while (b->prefix_matches(prompt(-1), steady_ms(), 1).empty()) {
    if (Clock::now() > warm_deadline) {
      std::fprintf(stderr, "kv_index_bench: Redis at %s does not answer\n", url.c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  std::vector<Clock::time_point> sent(static_cast<std::size_t>(records));
  std::thread writer([&] {
    const auto period = std::chrono::nanoseconds(1'000'000'000 / rate);
    const auto t0 = Clock::now();
    for (int i = 0; i < records; ++i) {
      std::this_thread::sleep_until(t0 + period * i);
      sent[static_cast<std::size_t>(i)] = Clock::now();
      a->record_prefix(prompt(i), where, steady_ms());
    }
  });
  std::vector<double> lat;
  lat.reserve(static_cast<std::size_t>(records));
  const auto deadline =
      Clock::now() + std::chrono::seconds(10) + std::chrono::milliseconds(1000LL * records / rate);
  for (int i = 0; i < records && Clock::now() < deadline;) {
    const auto h = prompt(i);
    if (!b->prefix_matches({h.back()}, steady_ms(), 1).empty()) {
      lat.push_back(us(Clock::now() - sent[static_cast<std::size_t>(i)]));
      ++i;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  writer.join();
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) {
    return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, std::size_t(p * lat.size()))];
  };
  std::printf("records %d at %d/s, %d blocks each: %zu seen by B\n", records, rate, blocks,
              lat.size());
  std::printf("propagation ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", pct(0.5) / 1000,
              pct(0.9) / 1000, pct(0.99) / 1000, lat.empty() ? 0.0 : lat.back() / 1000);
  std::printf("A published %llu, dropped %llu; B applied %llu, rejected %llu\n",
              static_cast<unsigned long long>(a->stats().published.load()),
              static_cast<unsigned long long>(a->stats().dropped.load()),
              static_cast<unsigned long long>(b->stats().applied.load()),
              static_cast<unsigned long long>(b->stats().rejected.load()));
  return lat.size() == static_cast<std::size_t>(records) ? 0 : 1;
}
