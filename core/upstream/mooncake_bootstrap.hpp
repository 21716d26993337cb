// Mooncake's bootstrap server: a prefill engine with MooncakeConnector runs
// one (VLLM_MOONCAKE_BOOTSTRAP_PORT on its host) that answers GET /query
// with the engine id of each data-parallel rank (vLLM's
// mooncake_connector.py, MooncakeBootstrapServer). Decode's params name
// that id, so the gateway reads it before sending a parallel decode leg;
// each worker keeps the answers for a while, per prefill instance.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "core/base/result.hpp"
#include "core/config/config.hpp"
#include "core/routing/kv_params.hpp"

namespace pdgate {

class MooncakeBootstrap {
 public:
  struct Limits {
    std::chrono::milliseconds ttl{60'000};     // an answer is used this long
    std::chrono::milliseconds timeout{2'000};  // the whole GET
    std::size_t max_entries = 1024;            // prefill instances remembered
    std::size_t max_answer = 64u << 10;        // bytes of one answer
  };
  MooncakeBootstrap() = default;
  explicit MooncakeBootstrap(Limits limits) : limits_(limits) {}

  // "http://host:port" of the bootstrap server of `prefill`; `port` 0: the
  // instance's own port.
  static std::string address(const UpstreamSpec& prefill, std::uint16_t port);

  // The engine id of `rank` on `prefill`'s bootstrap server: cached, or
  // read now (bounded by the limits). Fails with a message for the log.
  boost::asio::awaitable<Result<std::string>> engine_id(boost::asio::any_io_executor ex,
                                                        const UpstreamSpec& prefill,
                                                        std::uint16_t port, std::uint32_t rank);

  std::size_t size() const { return cache_.size(); }

 private:
  struct Entry {
    std::vector<RankEngineId> ranks;
    std::chrono::steady_clock::time_point fetched_at;
  };
  void remember(const std::string& key, std::vector<RankEngineId> ranks,
                std::chrono::steady_clock::time_point now);

  Limits limits_;
  std::unordered_map<std::string, Entry> cache_;
};

}  // namespace pdgate
