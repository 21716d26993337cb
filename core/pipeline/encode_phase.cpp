#include "core/pipeline/encode_phase.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>
#include <boost/asio/this_coro.hpp>

#include "core/base/child_group.hpp"
#include "core/pipeline/engine_call.hpp"
#include "core/pipeline/engine_errors.hpp"
#include "core/pipeline/failover.hpp"

namespace pdgate {

namespace {

// An encoder's answer is one token of JSON; it is read and dropped.
constexpr std::size_t kMaxEncoderResponse = 16u << 20;

bool is_media_type(std::string_view t) {
  return t == "image_url" || t == "audio_url" || t == "input_audio";
}

// The fan-out's shared state; lives in run_encode_stage's frame, which
// waits for every child before it returns.
struct FanOut {
  RequestScope scope;  // the encoders' connections: aborted together
  std::optional<GatewayError> first_error;
  std::size_t next = 0;  // the next item a lane takes
};

void fail_fan_out(FanOut& fan, GatewayError error) {
  if (fan.first_error)
    return;
  fan.first_error = std::move(error);
  fan.scope.on_client_gone();  // fail fast: the siblings' work is wasted now
}

// One encoder request. On failure it records the first error and aborts
// its siblings.
net::awaitable<void> encode_one(WorkerContext& w, InstancePtr inst, PickContext ctx,
                                http::request<http::string_body> up, StageSpan span, FanOut& fan) {
  std::optional<GatewayError> error;
  {
    InFlightGuard guard(inst, 0, &w.registry.load_signal());
    StageReport report(w.picker, inst, ctx);
    auto [err, ex] =
        co_await UpstreamExchange::start(w.pools.for_instance(inst), up, fan.scope, w.timeouts());
    if (ex) {
      report.header(ex->status());
      span.status(ex->status());
    }
    if (err) {
      // Aborted: a sibling failed first, or the client left.
      if (err.kind != UpstreamFailure::aborted)
        error = upstream_failure(Stage::encode, err);
    } else if (ex->status() < 200 || ex->status() >= 300) {
      error = co_await engine_status_error(Stage::encode, *ex, *inst);
    } else {
      std::string answer;
      auto rerr = co_await ex->read_all(answer, kMaxEncoderResponse);
      if (rerr.kind == UpstreamFailure::aborted)
        span.error(to_string(ErrorKind::client_gone),
                   "aborted: a sibling failed or the client left");
      if (!rerr) {
        report.first_token();
        ex->finish();
        inst->note_request_success();
        report.succeeded();
      } else if (rerr.kind != UpstreamFailure::aborted) {
        error = upstream_failure(Stage::encode, rerr);
      }
    }
    if (error) {
      blame(w, *inst, *error);
      trace_error(span, *error);
    } else if (err) {
      span.error(to_string(ErrorKind::client_gone), "aborted: a sibling failed or the client left");
    }
  }
  if (error && !fan.first_error) {
    spdlog::warn("encoder request {} failed: {}", std::string(up["x-request-id"]), error->message);
    fail_fan_out(fan, std::move(*error));
  }
}

// One of a request's lanes: takes the next item, waits for one of the
// worker's encoder slots, makes the call; again until the items run out or
// the fan-out fails. A request makes as many calls at once as it has lanes
// (--encode-concurrency), a worker as many as it has slots
// (--encode-max-inflight): thousands of items never mean thousands of
// connections.
net::awaitable<void> encode_lane(RequestContext& rc, const std::vector<std::string_view>& items,
                                 const std::vector<InstancePtr>& chosen, std::string_view model_raw,
                                 const PickContext& ctx, FanOut& fan) {
  WorkerContext& w = rc.w;
  for (;;) {
    if (fan.first_error || fan.scope.client_gone() || fan.next >= items.size())
      co_return;
    const std::size_t i = fan.next++;
    if (!co_await w.encoder_slots.acquire(w.cfg.first_byte_timeout)) {
      GatewayError e = gateway_error(ErrorKind::overloaded,
                                     "encode stage failed: too many encoder calls are waiting");
      e.stage = "encode";
      fail_fan_out(fan, std::move(e));
      co_return;
    }
    CallSlot slot(w.encoder_slots);
    if (fan.first_error || fan.scope.client_gone())
      co_return;
    const std::string child_id =
        rc.request_id() + ":" + std::to_string(i) + ":" + w.request_ids.hex(6);
    StageSpan span = rc.trace.stage("encode", chosen[i]->spec.url, 0);
    span.attribute("pdgate.encode.item", static_cast<std::int64_t>(i));
    auto up = upstream_request(http::verb::post, *chosen[i], "/v1/chat/completions",
                               make_encoder_body(model_raw, items[i]), child_id, rc.fwd,
                               span.traceparent());
    co_await encode_one(w, chosen[i], ctx, std::move(up), std::move(span), fan);
  }
}

}  // namespace

std::vector<std::string_view> find_media_items(std::string_view body,
                                               const JsonObjectIndex& index) {
  std::vector<std::string_view> items;
  auto messages = raw_member(body, index, "messages");
  if (!messages)
    return items;
  JsonArrayElements messages_in(*messages);
  std::string_view msg;
  while (messages_in.next(msg)) {
    auto mi = index_json_object(msg);
    if (!mi)
      continue;
    auto content = raw_member(msg, *mi, "content");
    if (!content)
      continue;
    JsonArrayElements items_in(*content);
    std::string_view item;
    while (items_in.next(item)) {
      auto ii = index_json_object(item);
      if (!ii)
        continue;
      auto type = string_member(item, *ii, "type");
      if (type && is_media_type(*type))
        items.push_back(item);
    }
  }
  return items;
}

std::string make_encoder_body(std::string_view model_raw, std::string_view item_raw) {
  std::string b;
  b.reserve(item_raw.size() + model_raw.size() + 96);
  b += "{\"model\":";
  b += model_raw;
  b += ",\"messages\":[{\"role\":\"user\",\"content\":[";
  b += item_raw;
  b += "]}],\"max_tokens\":1,\"stream\":false}";
  return b;
}

net::awaitable<bool> encode_phase(RequestContext& rc) {
  WorkerContext& w = rc.w;
  const InstanceSet& set = *rc.set;
  const std::string_view body = rc.body;
  const JsonObjectIndex& index = rc.index;
  const std::string& request_id = rc.request_id();
  RequestScope& scope = rc.scope;
  if (!rc.is_chat)
    co_return true;
  // Without encoders the engines encode media themselves.
  if (set.encode.empty())
    co_return true;
  const auto items = find_media_items(body, index);
  if (items.empty())
    co_return true;
  if (items.size() > w.cfg.encode_max_items) {
    co_return rc.fail(
        client_error(ErrorKind::bad_request,
                     "too many image and audio items: " + std::to_string(items.size()) +
                         " (at most " + std::to_string(w.cfg.encode_max_items) + ")",
                     "messages"));
  }
  const std::string_view model_raw = raw_member(body, index, "model").value_or("null");

  PickContext ctx = rc.pick();
  ctx.stage = Stage::encode;
  // Every instance is picked before anything is sent: a missing encoder
  // fails the request without wasting the others' work.
  std::vector<InstancePtr> chosen;
  for (std::size_t i = 0; i < items.size(); ++i) {
    auto inst = w.picker.pick(set.encode, ctx);
    if (!inst)
      co_return rc.fail(no_instance(Stage::encode, w.picker));
    chosen.push_back(std::move(inst));
  }
  if (rc.outcome.record) {
    auto& used = rc.outcome.record->encode;
    for (const auto& inst : chosen) {
      if (std::find(used.begin(), used.end(), inst) == used.end())
        used.push_back(inst);
    }
  }

  auto executor = co_await net::this_coro::executor;
  FanOut fan;
  scope.add_child(&fan.scope);
  ChildGroup children(executor, [&fan] { fan.scope.on_client_gone(); });
  const std::size_t lanes =
      std::min(items.size(), std::max<std::size_t>(1, w.cfg.encode_concurrency));
  for (std::size_t l = 0; l < lanes; ++l)
    children.spawn(encode_lane(rc, items, chosen, model_raw, ctx, fan));
  // Waits for every child, failures included (they end fast: a failure
  // aborts the rest), so none outlives `fan`.
  co_await children.wait();
  scope.remove_child(&fan.scope);
  if (children.failure() && !fan.first_error) {
    spdlog::error("request {}: an encoder request threw: {}", request_id, *children.failure());
    fan.first_error = gateway_error(ErrorKind::internal, "encode stage failed: internal error");
    fan.first_error->stage = "encode";
  }
  if (fan.first_error)
    co_return rc.fail(std::move(*fan.first_error));
  if (scope.client_gone())
    co_return rc.fail(
        upstream_failure(Stage::encode, {UpstreamFailure::aborted, "client went away"}));
  spdlog::debug("request {}: {} encoder request(s) succeeded", request_id, items.size());
  co_return true;
}

}  // namespace pdgate
