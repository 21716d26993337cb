#include "core/gateway/routes.hpp"

namespace pdgate {

void RouteTable::add(http::verb method, std::string path, RouteHandler handler, bool counted) {
  routes_.push_back({method, std::move(path), std::move(handler), counted});
}

RouteTable::Match RouteTable::find(http::verb method, std::string_view path) const {
  Match m;
  for (const auto& r : routes_) {
    if (r.path != path)
      continue;
    if (r.method == method) {
      m.handler = &r.handler;
      m.counted = r.counted;
      return m;
    }
    if (!m.allow.empty())
      m.allow += ", ";
    m.allow += std::string(http::to_string(r.method));
  }
  return m;
}

}  // namespace pdgate
