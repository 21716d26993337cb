// Stage 0 of a multimodal request (E -> P -> D, E -> PD): every image or
// audio item of `messages` goes to an encoder as its own request, several
// at once (--encode-concurrency per request, --encode-max-inflight per
// worker; more than --encode-max-items is refused with 400), before
// prefill or decode see the request. The encoders
// cache what they compute by a hash of the media bytes, so every item is
// copied byte for byte from the client's body, never re-serialized.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "core/base/json_body.hpp"
#include "core/base/result.hpp"
#include "core/net/errors.hpp"
#include "core/net/request_scope.hpp"
#include "core/pipeline/engine_call.hpp"
#include "core/pipeline/request_context.hpp"
#include "core/pipeline/worker.hpp"

namespace pdgate {

// Raw JSON text of every `image_url`, `audio_url` and `input_audio` content
// item of `messages`, in order (views into `body`). Messages whose content
// is not an array hold no items. `body` must be the indexed text.
std::vector<std::string_view> find_media_items(std::string_view body, const JsonObjectIndex& index);

// The encoder's request for one item: the client's model (raw), the item
// alone as the only content (no text), max_tokens 1, not streaming.
std::string make_encoder_body(std::string_view model_raw, std::string_view item_raw);

// The encode phase (chat requests): sends every media item to an encoder
// chosen by the picker and waits for all. Returns the error that answers
// the request when any encoder fails (the encoder's own 4xx, else a 502
// naming the encode stage); the others are aborted at once. Returns
// nothing when all succeeded, when the request has no media or when no
// encoders are configured.
net::awaitable<bool> encode_phase(RequestContext& rc);

}  // namespace pdgate
