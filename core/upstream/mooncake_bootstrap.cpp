#include "core/upstream/mooncake_bootstrap.hpp"

#include "core/base/url.hpp"
#include "core/upstream/health.hpp"

namespace pdgate {

namespace {

std::string host_for_url(const std::string& host) {
  // An IPv6 literal goes in brackets.
  return host.find(':') != std::string::npos && host.front() != '[' ? "[" + host + "]" : host;
}

}  // namespace

std::string MooncakeBootstrap::address(const UpstreamSpec& prefill, std::uint16_t port) {
  return "http://" + host_for_url(prefill.host) + ":" +
         std::to_string(port == 0 ? prefill.port : port);
}

void MooncakeBootstrap::remember(const std::string& key, std::vector<RankEngineId> ranks,
                                 std::chrono::steady_clock::time_point now) {
  if (cache_.size() >= limits_.max_entries && cache_.find(key) == cache_.end()) {
    // Full: drop what expired, else the oldest answer.
    auto oldest = cache_.begin();
    for (auto it = cache_.begin(); it != cache_.end();) {
      if (now - it->second.fetched_at >= limits_.ttl) {
        it = cache_.erase(it);
        continue;
      }
      if (it->second.fetched_at < oldest->second.fetched_at)
        oldest = it;
      ++it;
    }
    if (cache_.size() >= limits_.max_entries && oldest != cache_.end())
      cache_.erase(oldest);
  }
  cache_[key] = Entry{std::move(ranks), now};
}

boost::asio::awaitable<Result<std::string>> MooncakeBootstrap::engine_id(
    boost::asio::any_io_executor ex, const UpstreamSpec& prefill, std::uint16_t port,
    std::uint32_t rank) {
  const std::string key = address(prefill, port);
  const auto now = std::chrono::steady_clock::now();
  auto it = cache_.find(key);
  if (it == cache_.end() || now - it->second.fetched_at >= limits_.ttl) {
    ProbeResult r = co_await probe_get(ex, prefill.host, port == 0 ? prefill.port : port, "/query",
                                       limits_.timeout, {}, nullptr, limits_.max_answer);
    if (r.status != 200) {
      co_return fail("Mooncake bootstrap server " + key + " did not answer /query: " +
                     (r.status == 0 ? r.error : "HTTP " + std::to_string(r.status)));
    }
    auto ranks = parse_mooncake_query(r.body);
    if (!ranks)
      co_return fail("Mooncake bootstrap server " + key + ": " + ranks.error());
    remember(key, std::move(*ranks), std::chrono::steady_clock::now());
    it = cache_.find(key);
  }
  for (const RankEngineId& e : it->second.ranks) {
    if (e.rank == rank)
      co_return e.engine_id;
  }
  co_return fail("Mooncake bootstrap server " + key + " names no engine for rank " +
                 std::to_string(rank));
}

}  // namespace pdgate
