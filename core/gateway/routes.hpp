// The client port's routes, in one table: method and path to a handler.
// The gateway fills it once at start; every connection dispatches through
// it (core/gateway/client_session.cpp), so the routes are listed in one place.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http.hpp>
#include "core/net/maybe_tls_stream.hpp"

#include "core/pipeline/client_request.hpp"

namespace pdgate {

// Serves the request; returns whether the connection may be reused.
using RouteHandler = std::function<net::awaitable<bool>(ClientRequest&)>;

class RouteTable {
 public:
  // `counted`: the request is counted in pdgate_requests_total and
  // pdgate_request_duration_seconds (the completion routes).
  void add(http::verb method, std::string path, RouteHandler handler, bool counted = false);

  struct Match {
    const RouteHandler* handler = nullptr;  // null: no route
    bool counted = false;
    // The path exists with other methods (405 with Allow rather than 404).
    std::string allow;
  };
  Match find(http::verb method, std::string_view path) const;

 private:
  struct Route {
    http::verb method;
    std::string path;
    RouteHandler handler;
    bool counted;
  };
  std::vector<Route> routes_;
};

}  // namespace pdgate
