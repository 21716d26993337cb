// The conversation stores pdgate ships (core/routing/conversation_store.hpp): the
// composition root (main) picks one from the options.
#pragma once

#include <memory>

#include "core/base/result.hpp"
#include "core/routing/conversation_store.hpp"
#include "plugins/redis_client_context.hpp"

namespace pdgate {

// Memory store when `redis_url` is empty, else Redis. Fails on a malformed
// URL; never connects here (each handle connects on its own worker).
// `redis`: the TLS context of rediss:// and where the connections' state
// is counted.
Result<std::unique_ptr<ConversationStores>> make_conversation_stores(
    const ConversationStoreOptions& options, RedisClientContext redis = {});

}  // namespace pdgate
