// The interface of the conversation stores (implementations in plugins/:
// memory and Redis). Where the gateway keeps, per conversation, the kv_transfer_params a
// decode handed out at the end of a turn, so the next turn's prefill can
// read those blocks instead of recomputing the history (multi-turn reuse,
// docs/conversations.md). Two kinds sit behind one interface: a bounded map
// in this process (one replica) and Redis (any replica can serve any turn).
//
// Layout: one ConversationStores per gateway process (shared state: the
// map, the counters, the Redis settings), and from it one ConversationStore
// handle per worker thread, used only on that worker's executor. Handles
// never block the event loop: the Redis handle owns its own asynchronous
// connection, the memory handle only takes a short mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "core/base/result.hpp"
#include "core/base/warn_limiter.hpp"

namespace pdgate {

namespace net = boost::asio;

// What a take found. `error` means the store could not answer (Redis down,
// slow or answering nonsense): the caller treats it like a miss, but it is
// counted apart so operators see the store is sick.
struct TakeResult {
  enum class Kind { hit, miss, error };
  Kind kind = Kind::miss;
  std::string params;  // the stored value, on a hit (found; not yet judged usable)
  std::string detail;  // why, on an error

  static TakeResult hit(std::string p) { return {Kind::hit, std::move(p), {}}; }
  static TakeResult miss() { return {}; }
  static TakeResult error(std::string why) { return {Kind::error, {}, std::move(why)}; }
};

// Process-wide counters, shared by every worker's handle. Relaxed atomics:
// they are read by /health and /metrics, never used to make decisions.
struct ConversationCounters {
  // Turns that reused the previous turn's blocks (counted by
  // core/routing/conversation.cpp once the history matched, not by the stores).
  std::atomic<std::uint64_t> hits{0};
  // Turns that named a conversation and reused nothing, by reason:
  // nothing stored for this client and conversation (expired included;
  // counted by the stores), ...
  std::atomic<std::uint64_t> misses_none{0};
  // ... an entry made for another history (an edited or regenerated turn)
  // or by a previous version that recorded none, ...
  std::atomic<std::uint64_t> misses_history{0};
  // ... or no client identity to scope the conversation by.
  std::atomic<std::uint64_t> misses_scope{0};
  // Entries found past their TTL (memory store only: Redis drops expired
  // keys silently, so there they count as misses).
  std::atomic<std::uint64_t> expired{0};
  // Evicted by the memory store's size cap before they were used.
  std::atomic<std::uint64_t> evicted{0};
  // Store failures: timeouts, disconnections, unexpected replies, and
  // stored values that are not usable params.
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> puts{0};
  // Turns of a named conversation whose decode answered without
  // kv_transfer_params: nothing to store, so the next turn recomputes its
  // history. Usually the decode engines are not set up to issue them.
  std::atomic<std::uint64_t> turns_without_params{0};
  WarnLimiter without_params_warnings{std::chrono::seconds(30)};

  void add(std::atomic<std::uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }
};

struct ConversationStoreHealth {
  std::string kind;      // "memory" | "redis"
  std::string endpoint;  // redis: the URL without its password; memory: empty
  bool reachable = true;
  std::optional<std::size_t> entries;  // only where counting is cheap (memory)
};

struct ConversationStoreOptions {
  // Empty: the in-memory store. Otherwise redis://[user:password@]host[:port][/db]
  // or unix:///path/to/socket[?db=N&password=P].
  std::string redis_url;
  std::string key_prefix = "pdgate:";
  // The longest a request waits for Redis before it proceeds as a miss.
  std::chrono::milliseconds redis_timeout{50};
  // Connecting (TCP connect + AUTH/SELECT/PING) gives up after this.
  std::chrono::milliseconds redis_connect_timeout{1000};
  std::chrono::milliseconds reconnect_min{100};
  std::chrono::milliseconds reconnect_max{5000};
  // Memory store bound: least recently stored entries go first.
  std::size_t memory_capacity = 100000;
  // Params are a few hundred bytes; anything far larger is not worth
  // storing and would let one client grow the store without bound.
  std::size_t max_value_bytes = 64u << 10;
};

// One worker's handle. Every call must be made on the executor the handle
// was created for.
class ConversationStore {
 public:
  virtual ~ConversationStore() = default;

  // Atomically takes and deletes the entry: a conversation's params are
  // used by one turn only, across replicas.
  virtual net::awaitable<TakeResult> take(std::string conversation_id) = 0;

  // Stores (replacing) the params with an expiry. False when the store
  // failed or refused the value; the turn itself is not affected.
  virtual net::awaitable<bool> put(std::string conversation_id, std::string params_json,
                                   std::chrono::seconds ttl) = 0;
};

// The process-wide part: creates the per-worker handles, owns what they
// share, answers /health.
class ConversationStores {
 public:
  virtual ~ConversationStores() = default;
  virtual std::unique_ptr<ConversationStore> make_handle(net::any_io_executor worker) = 0;
  virtual ConversationStoreHealth health() const = 0;
  ConversationCounters& counters() { return counters_; }
  const ConversationCounters& counters() const { return counters_; }

 protected:
  ConversationCounters counters_;
};

}  // namespace pdgate
