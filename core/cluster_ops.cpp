#include "core/cluster_ops.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/this_coro.hpp>

#include <boost/uuid/uuid_io.hpp>

#include "core/child_group.hpp"
#include "core/errors.hpp"
#include "core/stage.hpp"

namespace pdgate {

namespace {

constexpr std::size_t kMaxReplyBody = 1u << 20;
// A /health that takes longer than this counts as unhealthy: load
// balancers poll the gateway's /health with short timeouts of their own.
constexpr UpstreamTimeouts kHealthTimeouts{Millis(1'000), Millis(2'000)};

net::awaitable<void> ask_one(WorkerContext& w, InstancePtr inst,
                             http::request<http::string_body> up, UpstreamTimeouts timeouts,
                             RequestScope& scope, FanOutReply& out) {
  auto [err, ex] =
      co_await UpstreamExchange::start(w.pools.for_instance(inst), up, scope, timeouts);
  if (err) {
    out.error = err.detail;
  } else {
    auto rerr = co_await ex->read_all(out.body, kMaxReplyBody);
    if (rerr) {
      out.error = rerr.detail;
    } else {
      out.status = ex->status();
      ex->finish();
    }
  }
}

std::vector<InstancePtr> all_instances(const InstanceSet& set) {
  std::vector<InstancePtr> all;
  for (const auto* list : {&set.encode, &set.prefill, &set.decode}) {
    all.insert(all.end(), list->begin(), list->end());
  }
  return all;
}

}  // namespace

net::awaitable<std::vector<FanOutReply>> fan_out(WorkerContext& w,
                                                 const std::vector<InstancePtr>& targets,
                                                 http::verb method, std::string target,
                                                 std::string body, std::string authorization,
                                                 UpstreamTimeouts timeouts, RequestScope& scope) {
  std::vector<FanOutReply> replies(targets.size());
  if (targets.empty())
    co_return replies;
  auto executor = co_await net::this_coro::executor;
  ChildGroup children(executor);
  const std::string request_id = boost::uuids::to_string(w.uuids());
  for (std::size_t i = 0; i < targets.size(); ++i) {
    auto up = upstream_request(method, *targets[i], target, body, request_id, authorization);
    children.spawn(ask_one(w, targets[i], std::move(up), timeouts, scope, replies[i]));
  }
  // Every child ends (answer, error, timeout or exception) before
  // `replies` goes away.
  co_await children.wait();
  if (children.failure()) {
    spdlog::error("request {}: a fan-out request threw: {}", request_id, *children.failure());
    for (auto& r : replies) {
      if (r.status == 0 && r.error.empty())
        r.error = "internal error";
    }
  }
  co_return replies;
}

net::awaitable<std::pair<http::status, nlohmann::json>> aggregated_health(WorkerContext& w,
                                                                          const InstanceSet& set,
                                                                          nlohmann::json extra,
                                                                          RequestScope& scope) {
  const auto all = all_instances(set);
  auto replies = co_await fan_out(w, all, http::verb::get, "/health", {}, w.default_authorization,
                                  kHealthTimeouts, scope);
  nlohmann::json j = std::move(extra);
  auto instances = nlohmann::json::array();
  bool ok = true;
  std::size_t at = 0;
  for (auto [role, list] : {std::pair{"encode", &set.encode}, std::pair{"prefill", &set.prefill},
                            std::pair{"decode", &set.decode}}) {
    std::size_t healthy = 0;
    for (std::size_t i = 0; i < list->size(); ++i, ++at) {
      const auto& r = replies[at];
      const bool up = r.status >= 200 && r.status < 300;
      if (up)
        ++healthy;
      nlohmann::json inst = {{"url", (*list)[i]->spec.url}, {"role", role}, {"healthy", up}};
      if (!up)
        inst["error"] = r.status != 0 ? "answered " + std::to_string(r.status) : r.error;
      instances.push_back(std::move(inst));
    }
    const char* state = list->empty() ? "empty" : healthy > 0 ? "healthy" : "unhealthy";
    if (!list->empty() && healthy == 0)
      ok = false;
    j[std::string(role) + "_cluster"] = state;
  }
  j["status"] = ok ? "ok" : "unhealthy";
  j["proxy"] = "healthy";
  j["instances"] = std::move(instances);
  co_return std::pair{ok ? http::status::ok : http::status::service_unavailable, std::move(j)};
}

net::awaitable<std::pair<http::status, nlohmann::json>> profile_fan_out(
    WorkerContext& w, const InstanceSet& set, std::string path, std::string body,
    std::string authorization, RequestScope& scope) {
  const auto all = all_instances(set);
  auto replies = co_await fan_out(w, all, http::verb::post, path, std::move(body),
                                  std::move(authorization), w.timeouts(), scope);
  nlohmann::json j = {{"encode", nlohmann::json::array()},
                      {"prefill", nlohmann::json::array()},
                      {"decode", nlohmann::json::array()}};
  std::size_t not_found = 0;
  std::vector<std::string> failures;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto& r = replies[i];
    const auto& inst = *all[i];
    nlohmann::json e = {{"url", inst.spec.url}, {"status", r.status}};
    if (r.status == 404) {
      ++not_found;  // profiling is off on that engine
    } else if (r.status < 200 || r.status >= 300) {
      const std::string why = r.status != 0 ? "answered " + std::to_string(r.status) : r.error;
      e["error"] = why;
      failures.push_back(inst.spec.url + ": " + why);
    }
    j[to_string(inst.spec.role == Role::both ? Role::decode : inst.spec.role)].push_back(
        std::move(e));
  }
  if (!all.empty() && not_found == all.size()) {
    co_return std::pair{http::status::service_unavailable,
                        nlohmann::json::parse(
                            error_json(503, "Profiling endpoints are disabled on all instances"))};
  }
  if (!failures.empty()) {
    std::string msg = path + " failed on " + std::to_string(failures.size()) + " instance(s): ";
    for (std::size_t i = 0; i < failures.size(); ++i)
      msg += (i ? "; " : "") + failures[i];
    co_return std::pair{http::status::bad_gateway, nlohmann::json::parse(error_json(502, msg))};
  }
  co_return std::pair{http::status::ok, std::move(j)};
}

}  // namespace pdgate
