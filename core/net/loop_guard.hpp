// Routing-loop detection, the way proxies use Via (RFC 9110 section 7.6.3):
// every request pdgate sends to an engine carries a Via entry naming this
// gateway process ("1.1 pdgate-<16 hex digits>", random at start), after
// whatever Via the client's request had. A request that arrives with this
// gateway's own entry has come back around (the gateway, or another pdgate
// that forwards to it, was added as an engine) and is refused with 508
// instead of being sent round again; so are requests that already passed
// through too many pdgates.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pdgate {

// Most pdgate entries a request may carry: a chain deeper than this is a
// loop among gateways that do not share an identity.
inline constexpr std::size_t kMaxPdgateHops = 8;

class LoopGuard {
 public:
  // A fresh identity, from the OS's random source.
  LoopGuard();
  explicit LoopGuard(std::string token) : token_(std::move(token)) {}

  // "pdgate-<hex>": what this gateway writes into Via.
  const std::string& token() const { return token_; }

  // The Via value for a request sent upstream on behalf of a request that
  // carried `incoming` (empty when none, e.g. health checks).
  std::string via_for_upstream(std::string_view incoming) const;

  // Why a request carrying `via` must be refused (empty: it may pass).
  std::string refusal(std::string_view via) const;

 private:
  std::string token_;
};

}  // namespace pdgate
