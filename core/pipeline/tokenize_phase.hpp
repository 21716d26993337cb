// The tokenize phase (--tokenizer vllm): the prompt's token ids, asked of
// an engine's POST /tokenize before routing, so policies read exact cached
// tokens (pdgate.cached_tokens()) for any model and chat template. It
// never fails a request: without an answer in --tokenizer-timeout the
// request is routed without exact data.
#pragma once

#include <boost/asio/awaitable.hpp>

#include "core/pipeline/request_context.hpp"

namespace pdgate {

// Fills rc.token_ids and points the pick context at them, or leaves them
// empty. One decode instance is asked, chosen by the request id.
boost::asio::awaitable<void> tokenize_phase(RequestContext& rc);

}  // namespace pdgate
