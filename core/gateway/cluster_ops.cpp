#include "core/gateway/cluster_ops.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/this_coro.hpp>

#include "core/base/child_group.hpp"
#include "core/net/errors.hpp"
#include "core/pipeline/engine_call.hpp"
#include "core/pipeline/forwarded_headers.hpp"

namespace pdgate {

namespace {

constexpr std::size_t kMaxReplyBody = 1u << 20;

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
                                                 std::string body, const ForwardedHeaders& fwd,
                                                 UpstreamTimeouts timeouts, RequestScope& scope) {
  std::vector<FanOutReply> replies(targets.size());
  if (targets.empty())
    co_return replies;
  auto executor = co_await net::this_coro::executor;
  ChildGroup children(executor);
  const std::string request_id = w.request_ids.uuid();
  for (std::size_t i = 0; i < targets.size(); ++i) {
    auto up = upstream_request(method, *targets[i], target, body, request_id, fwd);
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

net::awaitable<std::pair<http::status, nlohmann::json>> profile_fan_out(
    WorkerContext& w, const InstanceSet& set, std::string path, std::string body,
    const ForwardedHeaders& fwd, RequestScope& scope) {
  const auto all = all_instances(set);
  auto replies =
      co_await fan_out(w, all, http::verb::post, path, std::move(body), fwd, w.timeouts(), scope);
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
