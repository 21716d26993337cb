// One client request being served, as a route handler receives it: the
// worker serving it, the connection it came on, the request as read, what
// it holds open upstream (cancelled together when the client leaves) and
// what it came to (status, stage and record, read at its single exit).
#pragma once

#include <boost/beast/http.hpp>

#include "core/net/maybe_tls_stream.hpp"
#include "core/net/request_scope.hpp"
#include "core/pipeline/request_outcome.hpp"
#include "core/pipeline/worker.hpp"

namespace pdgate {

struct ClientRequest {
  WorkerContext& w;
  MaybeTlsStream& client;
  http::request<http::string_body>& req;
  RequestScope& scope;
  RequestOutcome& outcome;
};

}  // namespace pdgate
