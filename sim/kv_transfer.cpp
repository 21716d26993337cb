// The KV hand-off between sims (kv_transfer.hpp): issuing params, pulling
// blocks from their issuer, and serving a peer's pull.
#include "sim/kv_transfer.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "sim/random_ids.hpp"

namespace pdgate::sim {

using nlohmann::json;

KvTransfer::KvTransfer(const SimOptions& opts, spdlog::logger& log, std::mt19937_64& rng,
                       Counters& counters, PrefixCache& cache, CacheEvents& cache_events,
                       std::uint16_t port)
    : opts_(opts),
      log_(log),
      rng_(rng),
      counters_(counters),
      cache_(cache),
      cache_events_(cache_events),
      port_(port),
      // Never from the seeded RNG: two sims started with the same --seed
      // must still have distinct engine ids.
      registry_(opts.engine_id.empty() ? random_uuid(std::random_device{}()) : opts.engine_id,
                std::chrono::seconds(opts.kv_expiry_s)) {}

awaitable<KvTransfer::Received> KvTransfer::receive(const GenRequest& g, const std::string& rid,
                                                    RequestRecord& rec) {
  Received r;
  if (!g.transfer_id.empty() && g.remote_prefill) {
    std::string why;
    const KvResult kv_result = co_await wait_for_transfer(g.kv, rid, why);
    counters_.count_kv(kv_result);
    rec.kv_result = kv_result;
    if (kv_result == KvResult::valid) {
      r.skip_prefill = opts_.role == SimRole::decode || opts_.role == SimRole::both;
    } else {
      r.failure = "KV transfer " + g.transfer_id + " failed: " + why;
    }
    co_return r;
  }
  if (g.remote_prefill || (g.remote_decode && g.names_remote)) {
    const KvResult kv_result = co_await pull(g.kv, rid);
    counters_.count_kv(kv_result);
    rec.kv_result = kv_result;
    if (kv_result == KvResult::valid) {
      if (g.remote_prefill) {
        r.skip_prefill = opts_.role == SimRole::decode || opts_.role == SimRole::both;
      } else {
        const auto ids = g.kv.contains("remote_block_ids")
                             ? flatten_block_ids(g.kv["remote_block_ids"])
                             : std::nullopt;
        r.remote_cached =
            cached_prefix_tokens(ids ? ids->size() : 0, cache_.block_size(), g.prompt.tokens);
      }
    }
  }
  co_return r;
}

ojson KvTransfer::issue(const std::string& rid, const std::string& text, std::size_t tokens,
                        bool lease) {
  auto ids = cache_events_.insert(text, cache_.block_hashes(text));
  if (tokens % cache_.block_size() != 0)
    ids.push_back(cache_.fresh_block_id());
  const std::string remote_request_id = "cmpl-" + rid + "-0-" + random_hex(rng_, 8);
  ojson params = make_kv_params(ids, engine_id(), remote_request_id, opts_.advertise_host, port_,
                                opts_.kv_transfer_mode);
  if (!opts_.kv_params_drop.empty())
    params.erase(opts_.kv_params_drop);
  std::optional<KvRegistry::Clock::duration> ttl;
  if (lease)
    ttl = std::chrono::milliseconds(opts_.kv_lease_ms);
  registry_.issue(remote_request_id, std::move(ids), std::chrono::steady_clock::now(), ttl);
  ++counters_.kv_issued;
  return params;
}

void KvTransfer::publish(const std::string& transfer_id, const std::string& text,
                         std::size_t tokens) {
  auto ids = cache_events_.insert(text, cache_.block_hashes(text));
  if (tokens % cache_.block_size() != 0)
    ids.push_back(cache_.fresh_block_id());
  registry_.issue(transfer_id, std::move(ids), std::chrono::steady_clock::now(),
                  std::chrono::milliseconds(opts_.kv_lease_ms));
  ++counters_.kv_issued;
}

awaitable<KvResult> KvTransfer::wait_for_transfer(const json& kv, const std::string& rid,
                                                  std::string& why) {
  // remote_bootstrap_addr is http://host:port (checked when parsed).
  const std::string addr = kv.value("remote_bootstrap_addr", std::string()).substr(7);
  const auto colon = addr.rfind(':');
  std::uint32_t port = 0;
  if (colon != std::string::npos) {
    for (char c : addr.substr(colon + 1))
      port = (c >= '0' && c <= '9' && port < 65536) ? port * 10 + (c - '0') : 70000;
  }
  if (colon == std::string::npos || port == 0 || port > 65535) {
    why = "remote_bootstrap_addr is not http://host:port";
    co_return KvResult::pull_failed;
  }
  std::string host = addr.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const json payload = {{"remote_engine_id", kv["remote_engine_id"]},
                        {"transfer_id", kv["transfer_id"]},
                        {"transfer_mode", "mooncake"}};
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.kv_wait_ms);
  for (;;) {
    why.clear();
    const KvResult r = co_await pull_http(host, static_cast<std::uint16_t>(port), payload, why);
    if (r == KvResult::valid || r == KvResult::reused)
      co_return r;
    if (std::chrono::steady_clock::now() >= deadline) {
      why = "prefill's KV did not arrive within " + std::to_string(opts_.kv_wait_ms) + " ms" +
            (why.empty() ? "" : " (" + why + ")");
      log_.warn("request {}: {}", rid, why);
      co_return r;
    }
    // The prefill leg runs at the same time: its blocks come when it is done.
    if (!co_await sleep_for(std::chrono::milliseconds(2)))
      co_return KvResult::pull_failed;
  }
}

// Asks the issuer named in the params to hand over the blocks.
awaitable<KvResult> KvTransfer::pull(const json& kv, const std::string& rid) {
  auto str = [&](const char* k) -> std::string {
    return kv.contains(k) && kv[k].is_string() ? kv[k].get<std::string>() : std::string();
  };
  const std::string host = str("remote_host");
  const std::string engine = str("remote_engine_id");
  const std::string remote_rid = str("remote_request_id");
  std::uint32_t port = 0;
  if (kv.contains("remote_port") && kv["remote_port"].is_number_unsigned()) {
    port = kv["remote_port"].get<std::uint32_t>();
  }
  KvResult result = KvResult::pull_failed;
  std::string why;
  if (host.empty() || engine.empty() || remote_rid.empty() || port == 0 || port > 65535) {
    why =
        "incomplete kv_transfer_params (need remote_host, remote_port, remote_engine_id, "
        "remote_request_id)";
  } else {
    json payload = {{"remote_engine_id", kv["remote_engine_id"]},
                    {"remote_request_id", kv["remote_request_id"]},
                    {"remote_block_ids", kv.value("remote_block_ids", json())}};
    // A push decode registers: it names no blocks, prefill writes those it holds.
    if (opts_.kv_transfer_mode == "push" && opts_.role != SimRole::prefill) {
      payload.erase("remote_block_ids");
      payload["transfer_mode"] = "push";
    }
    result = co_await pull_http(host, static_cast<std::uint16_t>(port), payload, why);
  }
  if (result != KvResult::valid) {
    log_.warn("request {}: kv pull from {}:{} ({}) -> {}{}{}", rid, host, port, remote_rid,
              to_string(result), why.empty() ? "" : ": ", why);
  }
  co_return result;
}

awaitable<KvResult> KvTransfer::pull_http(const std::string& host, std::uint16_t port,
                                          const json& payload, std::string& why) {
  auto ex = co_await net::this_coro::executor;
  beast::tcp_stream stream(ex);
  stream.expires_after(std::chrono::milliseconds(opts_.kv_pull_timeout_ms));
  boost::system::error_code ec;
  const auto addr = net::ip::make_address(host, ec);
  if (!ec) {
    auto [cec] = co_await stream.async_connect(tcp::endpoint(addr, port), use_nothrow);
    ec = cec;
  } else {
    tcp::resolver resolver(ex);
    const std::string service = std::to_string(port);
    auto [rec, results] = co_await resolver.async_resolve(host, service, use_nothrow);
    ec = rec;
    if (!ec) {
      auto [cec, ep] = co_await stream.async_connect(results, use_nothrow);
      ec = cec;
    }
  }
  if (ec) {
    why = "connect: " + ec.message();
    co_return KvResult::pull_failed;
  }
  Request rq{http::verb::post, "/sim/kv/pull", 11};
  rq.set(http::field::host, host + ":" + std::to_string(port));
  rq.set(http::field::content_type, "application/json");
  rq.keep_alive(false);
  rq.body() = payload.dump(-1, ' ', false, json::error_handler_t::replace);
  rq.prepare_payload();
  if (auto [wec, n] = co_await http::async_write(stream, rq, use_nothrow); wec) {
    why = "write: " + wec.message();
    co_return KvResult::pull_failed;
  }
  beast::flat_buffer b;
  http::response<http::string_body> rs;
  if (auto [rec, n] = co_await http::async_read(stream, b, rs, use_nothrow); rec) {
    why = "read: " + rec.message();
    co_return KvResult::pull_failed;
  }
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  switch (rs.result_int()) {
    case 200:
      co_return KvResult::valid;
    case 409:
      co_return KvResult::reused;
    case 404:
      co_return KvResult::unknown;
    default:
      why = "issuer answered HTTP " + std::to_string(rs.result_int());
      co_return KvResult::pull_failed;
  }
}

awaitable<bool> KvTransfer::serve_pull(Exchange& x) {
  const json b = json::parse(x.req.body(), nullptr, false);
  if (b.is_discarded() || !b.is_object()) {
    std::string bad = "{\"result\":\"bad_request\"}";
    co_return co_await reply(x, http::status::bad_request, std::move(bad), "application/json");
  }
  auto str = [&](const char* k) -> std::string {
    return b.contains(k) && b[k].is_string() ? b[k].get<std::string>() : std::string();
  };
  // Push registrations and Mooncake transfers name no blocks.
  const std::string mode = str("transfer_mode");
  const auto now = std::chrono::steady_clock::now();
  KvResult r = KvResult::unknown;
  if (mode == "mooncake") {
    r = registry_.consume_held(str("remote_engine_id"), str("transfer_id"), now);
  } else if (mode == "push") {
    r = registry_.consume_held(str("remote_engine_id"), str("remote_request_id"), now);
  } else {
    const auto ids = flatten_block_ids(b.value("remote_block_ids", json()));
    r = registry_.consume(str("remote_engine_id"), str("remote_request_id"),
                          ids.value_or(std::vector<std::int64_t>{}), now);
  }
  ++counters_.kv_pulls_served[static_cast<std::size_t>(r)];
  const auto status = r == KvResult::valid    ? http::status::ok
                      : r == KvResult::reused ? http::status::conflict
                                              : http::status::not_found;
  std::string answer = std::string("{\"result\":\"") + to_string(r) + "\"}";
  co_return co_await reply(x, status, std::move(answer), "application/json");
}

}  // namespace pdgate::sim
