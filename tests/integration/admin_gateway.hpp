// A pdgate process with its admin listener, for the admin API tests: the
// admin port is read from pdgate's second "listening on" line, and calls
// carry the admin key.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tests/integration/harness.hpp"

namespace pdgate::test {

inline const std::string kAdminKey = "s3cret-admin-key";

struct AdminGateway {
  AdminGateway(std::vector<std::string> args,
               std::map<std::string, std::string> env = {{"ADMIN_API_KEY", kAdminKey}}) {
    args.insert(args.end(), {"--admin-port", "0"});
    gw = std::make_unique<Gateway>(std::move(args), std::move(env));
    admin = gw->process().wait_listening();
  }
  std::uint16_t port() const { return gw->port(); }
  Response call(const std::string& method, const std::string& target, const Json& body = nullptr,
                Headers h = {{"X-API-Key", kAdminKey}}) {
    if (!body.is_null())
      h.emplace_back("Content-Type", "application/json");
    return http_request(admin, method, target, body.is_null() ? "" : body.dump(), h);
  }
  Json instances() { return call("GET", "/admin/instances").json()["instances"]; }
  Json instance_by_url(const std::string& url) {
    for (auto& i : instances()) {
      if (i["url"] == url)
        return i;
    }
    return nullptr;
  }
  std::unique_ptr<Gateway> gw;
  std::uint16_t admin = 0;
};

}  // namespace pdgate::test
