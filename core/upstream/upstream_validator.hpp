// Whether an instance learnt at run time may be used. Instances added
// through the admin API, instances other replicas share through Redis and
// addresses dns:// sources resolve to (plugins/dns_discovery.hpp) pass the
// same checks: the SSRF allow-list (--allowed-upstreams) on every
// address the host resolves to; then one GET /v1/models carrying this
// gateway's Via, which must not answer 508 (the instance is this gateway,
// or forwards to it: a routing loop) and, with --model, must list the
// model. Instances given on the command line are trusted as they are.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/address.hpp>

#include "core/base/result.hpp"
#include "core/config/config.hpp"
#include "core/net/loop_guard.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

struct EngineTls;

// One allowed upstream network ("10.0.0.0/8", "::1/128", "127.0.0.1").
struct Cidr {
  boost::asio::ip::address network;
  unsigned prefix = 0;
  bool contains(const boost::asio::ip::address& a) const;
};
Result<Cidr> parse_cidr(const std::string& text);

class UpstreamValidator {
 public:
  // Parses --allowed-upstreams; fails with a message naming the bad entry.
  // `cfg` and `loop_guard` must outlive the validator; `tls` reaches
  // https:// instances.
  static Result<UpstreamValidator> create(const Config& cfg, const LoopGuard& loop_guard,
                                          std::shared_ptr<const EngineTls> tls = nullptr);

  // Empty when `spec` may be used; else 403 (an address outside the
  // allow-list) or 422 (does not resolve, would loop, does not serve the
  // model). Without --model an instance that does not answer yet passes
  // (the health checks judge it). Name resolution and the probe are each
  // bounded by --model-check-timeout. Runs on the calling coroutine's
  // executor, without blocking it.
  boost::asio::awaitable<std::optional<RegistryError>> check(const UpstreamSpec& spec) const;

 private:
  UpstreamValidator(const Config& cfg, const LoopGuard& loop_guard, std::vector<Cidr> allowed,
                    std::shared_ptr<const EngineTls> tls)
      : cfg_(&cfg), loop_guard_(&loop_guard), allowed_(std::move(allowed)), tls_(std::move(tls)) {}

  const Config* cfg_;
  const LoopGuard* loop_guard_;
  std::vector<Cidr> allowed_;
  std::shared_ptr<const EngineTls> tls_;
};

}  // namespace pdgate
