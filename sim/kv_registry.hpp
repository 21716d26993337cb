// The issuer side of the NIXL-like handshake: every set of kv_transfer_params
// an engine hands out is recorded here, and a peer's pull consumes it exactly
// once. Entries expire (the blocks are freed) after a TTL, like vLLM's
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT, and the map is bounded.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace pdgate::sim {

enum class KvResult { none, valid, reused, unknown, pull_failed };

const char* to_string(KvResult r);

// remote_block_ids arrive nested ([[1,2]], newer engines) or flat ([1,2]).
// Returns nullopt when the value is neither (null included).
std::optional<std::vector<std::int64_t>> flatten_block_ids(const nlohmann::json& v);

class KvRegistry {
 public:
  using Clock = std::chrono::steady_clock;

  KvRegistry(std::string engine_id, std::chrono::seconds ttl, std::size_t max_entries = 100000);

  const std::string& engine_id() const { return engine_id_; }

  // Records params as issued; their blocks count as held until consumed or
  // expired.
  // `ttl`: how long they are held (a prefill's lease); the registry's
  // own TTL when not given.
  void issue(const std::string& request_id, std::vector<std::int64_t> block_ids,
             Clock::time_point now, std::optional<Clock::duration> ttl = std::nullopt);

  // A peer pulls: valid (first time; blocks freed), reused (already pulled),
  // unknown (never issued here, expired, engine id or block ids mismatch).
  KvResult consume(const std::string& engine_id, const std::string& request_id,
                   const std::vector<std::int64_t>& block_ids, Clock::time_point now);
  // The same for a NIXL push registration or a Mooncake transfer, which
  // name no blocks (prefill sends the ones it holds).
  KvResult consume_held(const std::string& engine_id, const std::string& request_id,
                        Clock::time_point now);

  std::size_t outstanding(Clock::time_point now);         // issued, not consumed
  std::size_t outstanding_blocks(Clock::time_point now);  // blocks those hold
  std::size_t size(Clock::time_point now);                // entries incl. consumed

 private:
  struct Entry {
    std::vector<std::int64_t> block_ids;
    Clock::time_point issued_at;
    Clock::time_point expires_at;
    bool consumed = false;
  };
  void expire(Clock::time_point now);
  // `block_ids` null: any blocks held (push, Mooncake).
  KvResult take(const std::string& engine_id, const std::string& request_id,
                const std::vector<std::int64_t>* block_ids, Clock::time_point now);
  void erase_entry(const std::string& id);

  std::string engine_id_;
  std::chrono::seconds ttl_;
  std::size_t max_entries_;
  std::unordered_map<std::string, Entry> entries_;
  // Issue order, oldest first: expiry and the size bound both drop from the
  // front. An id re-issued later appears twice; stale positions are skipped.
  std::deque<std::pair<std::string, Clock::time_point>> order_;
  std::size_t outstanding_ = 0;
  std::size_t outstanding_blocks_ = 0;
};

}  // namespace pdgate::sim
