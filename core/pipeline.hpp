// The request pipeline for the completion routes: encode (multimodal,
// core/encode_stage.hpp) -> prefill -> decode (NIXL
// handshake) or one hop to a combined instance, and the relay of decode's
// answer to the client. Read top to bottom in pipeline.cpp.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include "core/request_scope.hpp"
#include "core/worker.hpp"

namespace pdgate {

// Serves one POST /v1/completions or /v1/chat/completions and writes the
// answer to `client`. Returns whether the client connection may be reused.
net::awaitable<bool> serve_completion(WorkerContext& w, beast::tcp_stream& client,
                                      http::request<http::string_body>& req, RequestScope& scope,
                                      bool is_chat);

// GET /v1/models, answered by a healthy decode instance.
net::awaitable<bool> serve_models(WorkerContext& w, beast::tcp_stream& client,
                                  http::request<http::string_body>& req, RequestScope& scope);

// Writes a whole response; returns false if the client is gone.
net::awaitable<bool> write_response(beast::tcp_stream& client,
                                    http::response<http::string_body>& res);

}  // namespace pdgate
