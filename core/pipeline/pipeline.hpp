// The completion routes' pipeline, phase by phase (pipeline.cpp): validate,
// encode (core/pipeline/encode_phase.hpp), prefill (core/pipeline/prefill_phase.hpp), decode
// (core/pipeline/decode_phase.hpp), relay (core/pipeline/relay.hpp). Each phase moves the
// request on or returns the GatewayError that ends it; finish() is the one
// place such an error becomes the client's answer and its metrics.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http.hpp>
#include "core/net/maybe_tls_stream.hpp"

#include "core/net/errors.hpp"
#include "core/net/request_scope.hpp"
#include "core/net/response_writer.hpp"
#include "core/pipeline/worker.hpp"

namespace pdgate {

// Serves one POST /v1/completions or /v1/chat/completions and writes the
// answer to `client`. Returns whether the client connection may be reused.
net::awaitable<bool> serve_completion(WorkerContext& w, MaybeTlsStream& client,
                                      http::request<http::string_body>& req, RequestScope& scope,
                                      bool is_chat);

// GET /v1/models, answered by a healthy decode instance.
net::awaitable<bool> serve_models(WorkerContext& w, MaybeTlsStream& client,
                                  http::request<http::string_body>& req, RequestScope& scope);

// Answers a request that failed with `err`: the status and body from the
// error table, the request id, the log line; records status and stage in
// `scope` for the metrics. Writes nothing when the client is gone.
// Returns whether the client connection may be reused.
net::awaitable<bool> finish(WorkerContext& w, MaybeTlsStream& client,
                            const http::request<http::string_body>& req,
                            const std::string& request_id, RequestScope& scope,
                            const GatewayError& err);

}  // namespace pdgate
