// The completion routes' pipeline (pipeline.cpp). serve_completion() runs
// a completion's phases in order, each in a file of its own:
//   admit          API key (admit_phase.hpp)
//   validate       JSON body, facts, forwarded headers (pipeline.cpp)
//   limits         the key's limits, its tokens reserved (admit_phase.hpp)
//   request hook   the policy's on_request (request_hook_phase.hpp)
//   tokenize       prompt token ids from an engine (tokenize_phase.hpp)
//   encode         multimodal items to encoders (encode_phase.hpp)
//   prefill        the prompt's KV on a prefill engine (prefill_phase.hpp)
//   decode         decode up to its first bytes (decode_phase.hpp)
//   relay          decode's answer to the client (relay.hpp)
// Each phase moves the request on or ends it with a GatewayError; finish()
// is the one place such an error becomes the client's answer and its
// metrics.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/awaitable.hpp>

#include "core/net/errors.hpp"
#include "core/pipeline/client_request.hpp"
#include "core/routing/request_facts.hpp"

namespace pdgate {

// PickContext::for_each_header over a client's request (`source`, an
// http::request<http::string_body>): every header but the credentials
// (Authorization, Proxy-Authorization, Cookie), names lower-cased.
void policy_headers(const void* source, void* user, PickContext::HeaderEmit emit);

// Serves one POST /v1/completions, /v1/chat/completions or /v1/responses
// (`api`) and writes the answer to `client`. Returns whether the client
// connection may be reused.
net::awaitable<bool> serve_completion(ClientRequest& c, GenerationApi api);

// Endpoints an engine answers alone, in one hop (vLLM's /tokenize,
// /detokenize, /v1/embeddings, /pooling, /classify, /score, /rerank,
// /v1/audio/transcriptions, ..., and GET /v1/models): how the route's
// body is read.
enum class ForwardBody : unsigned char {
  none,       // GET: no body
  json,       // a JSON object; its `model` picks among the instances
  multipart,  // multipart/form-data (an audio upload): sent as it came
};

// Forwards the client's request to `engine_path` on a healthy decode
// instance the picker chooses (for the body's `model` when it names one;
// another one when the call fails before the engine answered, as a
// completion's decode would), with a completion's client key, limits,
// tracing and error answers, and relays the engine's answer as it came.
// Returns whether the client connection may be reused.
net::awaitable<bool> serve_forwarded(ClientRequest& c, std::string_view engine_path,
                                     ForwardBody body);

// For a route that is not a completion but reaches engines (profiling):
// with API keys on, the request needs a valid client key within its
// limits, as a completion does. Nullopt when it may go on; else the
// refusal has been answered and the value says whether the connection may
// be reused.
net::awaitable<std::optional<bool>> refuse_without_client_key(ClientRequest& c);

// Answers a request that failed with `err`: the status and body from the
// error table, the request id, the log line; records status and stage in
// the request's outcome for the metrics. Writes nothing when the client
// is gone. Returns whether the client connection may be reused.
net::awaitable<bool> finish(ClientRequest& c, const std::string& request_id,
                            const GatewayError& err);

}  // namespace pdgate
