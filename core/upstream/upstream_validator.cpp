#include "core/upstream/upstream_validator.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <nlohmann/json.hpp>

#include "core/base/text.hpp"
#include "core/base/use_tuple.hpp"
#include "core/upstream/health.hpp"
#include "core/upstream/upstream.hpp"

namespace pdgate {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;
using json = nlohmann::json;

bool Cidr::contains(const net::ip::address& a) const {
  net::ip::address addr = a;
  if (addr.is_v6() && network.is_v4() && addr.to_v6().is_v4_mapped()) {
    addr = net::ip::make_address_v4(net::ip::v4_mapped, addr.to_v6());
  }
  if (addr.is_v4() != network.is_v4())
    return false;
  std::vector<unsigned char> x, y;
  if (addr.is_v4()) {
    auto b1 = addr.to_v4().to_bytes(), b2 = network.to_v4().to_bytes();
    x.assign(b1.begin(), b1.end());
    y.assign(b2.begin(), b2.end());
  } else {
    auto b1 = addr.to_v6().to_bytes(), b2 = network.to_v6().to_bytes();
    x.assign(b1.begin(), b1.end());
    y.assign(b2.begin(), b2.end());
  }
  unsigned bits = prefix;
  for (std::size_t i = 0; i < x.size() && bits > 0; ++i) {
    const unsigned take = std::min(bits, 8u);
    const auto mask = static_cast<unsigned char>(0xFFu << (8 - take));
    if ((x[i] & mask) != (y[i] & mask))
      return false;
    bits -= take;
  }
  return true;
}

Result<Cidr> parse_cidr(const std::string& text) {
  const std::string t = std::string(trim(text));
  const auto slash = t.find('/');
  beast::error_code ec;
  Cidr c;
  c.network = net::ip::make_address(t.substr(0, slash), ec);
  if (ec)
    return fail("--allowed-upstreams: '" + t + "' is not an address or CIDR");
  const unsigned max = c.network.is_v4() ? 32 : 128;
  c.prefix = max;
  if (slash != std::string::npos) {
    const std::string p = t.substr(slash + 1);
    char* end = nullptr;
    const unsigned long n = std::strtoul(p.c_str(), &end, 10);
    if (p.empty() || end != p.c_str() + p.size() || n > max) {
      return fail("--allowed-upstreams: bad prefix length in '" + t + "'");
    }
    c.prefix = static_cast<unsigned>(n);
  }
  return c;
}

Result<UpstreamValidator> UpstreamValidator::create(const Config& cfg, const LoopGuard& loop_guard,
                                                    std::shared_ptr<const EngineTls> tls) {
  std::vector<Cidr> allowed;
  for (const auto& a : cfg.allowed_upstreams) {
    auto c = parse_cidr(a);
    if (!c)
      return fail(c.error());
    allowed.push_back(*c);
  }
  return UpstreamValidator(cfg, loop_guard, std::move(allowed), std::move(tls));
}

net::awaitable<std::optional<RegistryError>> UpstreamValidator::check(
    const UpstreamSpec& spec) const {
  auto ex = co_await net::this_coro::executor;
  if (!allowed_.empty()) {
    // Every address the name resolves to must be allowed: a name that
    // also points inside the cluster must not slip through. An address
    // needs no resolving (nor the resolver's thread).
    std::vector<net::ip::address> addresses;
    beast::error_code not_literal;
    if (auto literal = net::ip::make_address(spec.host, not_literal); !not_literal) {
      addresses.push_back(literal);
    } else {
      auto [ec, results] = co_await resolve_until(
          ex, spec.host, spec.port, std::chrono::steady_clock::now() + cfg_->model_check_timeout);
      if (ec || results.empty()) {
        co_return client_error(ErrorKind::unprocessable,
                               "cannot resolve " + spec.host + ": " + ec.message());
      }
      for (const auto& r : results)
        addresses.push_back(r.endpoint().address());
    }
    for (const auto& addr : addresses) {
      bool ok = false;
      for (const auto& c : allowed_)
        ok = ok || c.contains(addr);
      if (!ok) {
        co_return client_error(ErrorKind::forbidden, spec.url + " resolves to " + addr.to_string() +
                                                         ", outside --allowed-upstreams");
      }
    }
  }
  // One GET /v1/models, carrying this gateway's Via: a 508 means the
  // instance is this gateway, or forwards to it, and adding it would make
  // every request (and health check) loop. Without --model an instance
  // that does not answer yet is still added (the checks will judge it).
  auto r = co_await probe_get(ex, spec.host, spec.port, "/v1/models", cfg_->model_check_timeout,
                              loop_guard_->via_for_upstream({}), spec.tls ? tls_.get() : nullptr);
  if (r.status == 508) {
    co_return client_error(ErrorKind::unprocessable,
                           "adding " + spec.url +
                               " would make a routing loop: it is this gateway, or a "
                               "gateway that forwards to it");
  }
  if (!cfg_->model.empty()) {
    if (r.status != 200) {
      std::string why = r.error;
      if (r.status != 0)
        why = "status " + std::to_string(r.status);
      co_return client_error(ErrorKind::unprocessable,
                             spec.url + "/v1/models did not answer 200 (" + why + "): not added");
    }
    auto j = json::parse(r.body, nullptr, false);
    bool serves = false;
    if (j.is_object() && j.contains("data") && j["data"].is_array()) {
      for (const auto& m : j["data"]) {
        serves = serves || (m.is_object() && m.contains("id") && m["id"] == cfg_->model);
      }
    }
    if (!serves) {
      co_return client_error(ErrorKind::unprocessable,
                             spec.url + " does not serve model '" + cfg_->model + "'");
    }
  }
  co_return std::nullopt;
}

}  // namespace pdgate
