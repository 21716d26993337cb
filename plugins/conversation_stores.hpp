// The conversation stores pdgate ships (core/routing/conversation_store.hpp): the
// composition root (main) picks one from the options.
#pragma once

#include <memory>

#include "core/base/result.hpp"
#include "core/routing/conversation_store.hpp"

namespace pdgate {

// Memory store when `redis_url` is empty, else Redis. Fails on a malformed
// URL; never connects here (each handle connects on its own worker).
Result<std::unique_ptr<ConversationStores>> make_conversation_stores(
    const ConversationStoreOptions& options);

}  // namespace pdgate
