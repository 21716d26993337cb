// The Redis conversation store: what lets any gateway replica serve any
// turn of a conversation. Keys are `<prefix>conv:<key>`, where <key> is
// the scoped key of the client and conversation (core/routing/turn_history.hpp);
// a put is `SET key entry EX ttl` (value and expiry in one command), a take is
// `GETDEL key` (take-and-delete in one command, so two replicas cannot
// both use one decode's blocks). Redis trouble never fails a request: the
// turn proceeds as a cache miss, counted and warned about (rate-limited).
#pragma once

#include <atomic>
#include <memory>

#include "core/routing/conversation_store.hpp"
#include "plugins/redis_connection.hpp"
#include "plugins/redis_protocol.hpp"

namespace pdgate {

class RedisConversationStores final : public ConversationStores {
 public:
  RedisConversationStores(const ConversationStoreOptions& options, RedisEndpoint endpoint,
                          RedisClientContext context = {});
  // Each handle has its own connection on its worker's event loop.
  std::unique_ptr<ConversationStore> make_handle(net::any_io_executor worker) override;
  ConversationStoreHealth health() const override;

  const ConversationStoreOptions& options() const { return options_; }
  const RedisConnectionSettings& settings() const { return settings_; }
  RedisConnectionsShared& connections() { return connections_; }
  WarnLimiter& warnings() { return warnings_; }
  // Set once a server answered that it does not know GETDEL (Redis < 6.2).
  std::atomic<bool>& use_script() { return use_script_; }

 private:
  ConversationStoreOptions options_;
  RedisConnectionSettings settings_;
  RedisConnectionsShared connections_;
  WarnLimiter warnings_{std::chrono::seconds(10)};
  std::atomic<bool> use_script_{false};
};

}  // namespace pdgate
