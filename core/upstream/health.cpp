#include "core/upstream/health.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "core/base/use_tuple.hpp"
#include "core/net/maybe_tls_stream.hpp"
#include "core/net/tls_context.hpp"
#include "core/upstream/probe_rounds.hpp"
#include "core/upstream/upstream.hpp"

namespace pdgate {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {
// How often removed instances are forgotten and, with checks off, ejected
// ones re-admitted.
constexpr auto kHousekeeping = std::chrono::milliseconds(250);
}  // namespace

net::awaitable<ProbeResult> probe_get(net::any_io_executor ex, std::string host, std::uint16_t port,
                                      std::string target, std::chrono::milliseconds timeout,
                                      std::string via, const EngineTls* tls,
                                      std::size_t body_limit) {
  ProbeResult r;
  // One deadline for the whole probe, name resolution included.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto [rec, results] = co_await resolve_until(ex, host, port, deadline);
  if (rec) {
    r.error = "cannot resolve " + host + ": " + rec.message();
    co_return r;
  }
  MaybeTlsStream stream(ex);
  stream.expires_at(deadline);
  const auto cec = co_await connect_stream(stream.tcp(), results);
  if (cec) {
    r.error = "connect: " + cec.message();
    r.local = is_local_resource_error(cec);
    co_return r;
  }
  if (tls != nullptr) {
    if (auto [hec, why] = co_await engine_handshake(stream, *tls, host); hec) {
      r.error = hec == beast::error::timeout
                    ? "TLS handshake timed out after " + std::to_string(timeout.count()) + "ms"
                    : "TLS handshake: " + why;
      co_return r;
    }
  }
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, host + ":" + std::to_string(port));
  req.set(http::field::user_agent, "pdgate-health");
  if (!via.empty())
    req.set(http::field::via, via);
  req.keep_alive(false);
  if (auto [wec, n] = co_await http::async_write(stream, req, use_tuple); wec) {
    r.error = "write: " + wec.message();
    co_return r;
  }
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(body_limit);
  if (auto [hec, n] = co_await http::async_read(stream, buffer, parser, use_tuple); hec) {
    r.error = hec == beast::error::timeout
                  ? "timed out after " + std::to_string(timeout.count()) + "ms"
                  : "read: " + hec.message();
    co_return r;
  }
  r.status = parser.get().result_int();
  r.body = std::move(parser.get().body());
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  co_return r;
}

namespace {

net::awaitable<void> check_one(const Config& cfg, Registry& registry, InstancePtr inst,
                               std::string via, const EngineTls* tls) {
  auto ex = co_await net::this_coro::executor;
  // A check must answer well within the interval.
  const auto timeout = std::max(std::chrono::milliseconds(200), cfg.health_interval / 2);
  auto r = co_await probe_get(ex, inst->spec.host, inst->spec.port, "/health", timeout,
                              std::move(via), inst->spec.tls ? tls : nullptr);
  if (r.local) {
    // The gateway's own shortage (out of file descriptors): holding it
    // against the engine would eject every healthy instance at once.
    spdlog::debug("health check of {} skipped: {}", inst->spec.url, r.error);
    co_return;
  }
  const bool ok = r.status >= 200 && r.status < 300;
  std::string why = r.status != 0 ? "answered " + std::to_string(r.status) : r.error;
  if (inst->note_check(ok, cfg.health_rise, cfg.health_fall, why) && registry.on_ejected)
    registry.on_ejected(*inst);
}

}  // namespace

net::awaitable<void> run_health_loop(const Config& cfg, Registry& registry,
                                     const LoopGuard& loop_guard,
                                     std::shared_ptr<const EngineTls> tls) {
  const std::string via = loop_guard.via_for_upstream({});
  auto ex = co_await net::this_coro::executor;
  const bool checks_on = cfg.health_interval.count() > 0;
  if (checks_on) {
    ProbeRounds rounds;
    rounds.instances = [&registry] { return registry.snapshot()->all(); };
    rounds.probe = [&cfg, &registry, via, tls](InstancePtr inst) {
      return check_one(cfg, registry, std::move(inst), via, tls.get());
    };
    rounds.interval = cfg.health_interval;
    rounds.max_concurrency = cfg.health_max_concurrency;
    net::co_spawn(ex, run_probe_rounds(std::move(rounds)), net::detached);
  }
  // Removed instances are forgotten soon after their last request ends,
  // whatever the checks are doing.
  net::steady_timer timer(ex);
  for (;;) {
    timer.expires_after(kHousekeeping);
    auto [ec] = co_await timer.async_wait(use_tuple);
    if (ec)
      co_return;
    registry.forget_idle();
    if (!checks_on) {
      const auto set = registry.snapshot();
      for (const auto& inst : set->by_id)
        inst->readmit_if_due(false);
    }
  }
}

}  // namespace pdgate
