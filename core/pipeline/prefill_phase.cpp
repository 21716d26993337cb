#include "core/pipeline/prefill_phase.hpp"

#include <cmath>
#include <mutex>

#include "core/pipeline/prompt_logprobs.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>

#include "core/base/json_edit.hpp"
#include "core/base/use_tuple.hpp"
#include "core/observability/usage.hpp"
#include "core/pipeline/engine_call.hpp"
#include "core/pipeline/engine_errors.hpp"
#include "core/pipeline/failover.hpp"
#include "core/routing/conversation.hpp"
#include "core/routing/kv_params.hpp"
#include "core/upstream/load_model.hpp"

namespace pdgate {

namespace {

// A prefill answer is one token of JSON plus the transfer params; anything
// near this size is not a prefill answer.
constexpr std::size_t kMaxPrefillResponse = 16u << 20;

// p2p-nccl names each peer by its ZMQ address, which only the instance's
// configuration can give.
GatewayError missing_kv_peer(Stage stage, const Instance& inst) {
  GatewayError g =
      gateway_error(ErrorKind::misconfigured,
                    "--kv-connector p2p-nccl: an instance has no ZMQ address "
                    "configured (give instances as URL@zmqhost:zmqport)",
                    "--kv-connector p2p-nccl: no ZMQ address configured for " + inst.spec.url +
                        " (give it as " + inst.spec.url + "@zmqhost:zmqport)");
  g.stage = to_string(stage);
  return g;
}

// A /v1/responses prefill, from the body the connector made for a
// completion: vLLM's ResponsesRequest reads max_output_tokens, not
// max_tokens (which it would ignore, and generate up to its default).
// `store: false`, so that the one-token answer never lands in the engines'
// response store, where only decode's whole answer belongs (a later
// previous_response_id names that one). `background` is refused earlier
// (read_facts); removed here all the same.
std::string responses_prefill_body(const std::string& completion_shaped) {
  auto index = index_json_object(completion_shaped);
  if (!index)
    return completion_shaped;  // the connector's edits keep it valid JSON
  JsonBodyEditor e(completion_shaped, *index);
  e.remove("max_tokens");
  e.set("max_output_tokens", "1");
  e.set("store", "false");
  e.remove("background");
  return e.render();
}

// The prompt tokens the engine computed for this prefill, in the units
// every prediction uses (`prompt`: the pick's count of the prompt): the
// share the engine's usage says it did not find cached, when it gave one
// that makes sense, else what the pick expected to be uncached. The
// engine knows what its cache really held: a prefix the index still lists
// but the engine has evicted is computed again, and that time is not the
// engine being slow.
std::int64_t computed_tokens(const PrefillAnswer& r, std::int64_t prompt, std::int64_t expected) {
  if (!r.cached_tokens || !r.prompt_tokens || *r.prompt_tokens == 0 ||
      *r.cached_tokens > *r.prompt_tokens)
    return expected;
  const double computed = static_cast<double>(*r.prompt_tokens - *r.cached_tokens) /
                          static_cast<double>(*r.prompt_tokens);
  return static_cast<std::int64_t>(std::llround(computed * static_cast<double>(prompt)));
}

}  // namespace

InstancePtr pick_prefill(RequestContext& rc, RecheckTerms terms) {
  PickContext ctx = rc.pick();
  ctx.stage = Stage::prefill;
  ctx.recheck_wait = terms.wait;
  ctx.rechecked = terms.second;
  const auto candidates = untried(rc.set->prefill, rc.tried_prefill);
  InstancePtr picked = rc.w.picker.pick(candidates, ctx);
  spdlog::debug("request {}: prefill on {} ({} candidate(s))", rc.request_id(),
                picked ? picked->spec.url : std::string("none"), candidates.size());
  return picked;
}

namespace {

// The policy asked to pick again once the replicas ahead of this one have
// picked and their picks have reached it (pdgate.RECHECK, with a `wait`
// that is not 0: the replica first in the order, or one alone, is asked
// again at once by the picker). The pick lock is let go for the wait (this
// worker's other requests and the other workers pick meanwhile) and taken
// again for the second pick. The wait is bounded:
// ReplicaOrder::kMaxSlots slots of at most 50 ms.
net::awaitable<InstancePtr> recheck_prefill(RequestContext& rc,
                                            std::unique_lock<std::timed_mutex>& picking,
                                            std::chrono::milliseconds wait) {
  WorkerContext& w = rc.w;
  if (picking.owns_lock())
    picking.unlock();
  const auto from = std::chrono::steady_clock::now();
  net::steady_timer timer(co_await net::this_coro::executor, wait);
  auto [ec] = co_await timer.async_wait(use_tuple);
  (void)ec;  // only the time matters
  picking = w.registry.pick_lock().hold();
  if (w.metrics != nullptr) {
    const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - from);
    w.metrics->pick_rechecks.fetch_add(1, std::memory_order_relaxed);
    w.metrics->pick_recheck_wait_us.fetch_add(static_cast<std::uint64_t>(waited.count()),
                                              std::memory_order_relaxed);
  }
  co_return pick_prefill(rc, RecheckTerms{std::chrono::milliseconds(0), true});
}

}  // namespace

// One prefill on `picked` (or an instance the picker chooses among those
// not tried yet), its connections in `scope`.
net::awaitable<PrefillAnswer> run_prefill(RequestContext& rc, std::string_view params,
                                          RequestScope& scope, InstancePtr picked) {
  WorkerContext& w = rc.w;
  PrefillAnswer r;
  PickContext ctx = rc.pick();
  ctx.stage = Stage::prefill;
  const auto started = std::chrono::steady_clock::now();
  // A pick made here and the reservation below are one step, so that a
  // pick on another worker counts this one (core/upstream/pick_lock.hpp);
  // an instance the caller picked is reserved as it comes. Released once
  // the request is counted, or by co_return's leaving the scope: before
  // anything waits either way.
  std::unique_lock<std::timed_mutex> picking;
  if (!picked) {
    picking = w.registry.pick_lock().hold();
    const auto wait = w.registry.replica_order().recheck_wait(w.cfg.load_sync_recheck_slot);
    picked = pick_prefill(rc, RecheckTerms{wait, false});
    if (!picked && w.picker.wants_recheck())
      picked = co_await recheck_prefill(rc, picking, wait);
  }
  r.instance = std::move(picked);
  if (!r.instance) {
    r.error = no_instance(Stage::prefill, w.picker);
    co_return r;
  }
  if (rc.connector.names_peers() && r.instance->spec.kv_peer.empty()) {
    r.error = missing_kv_peer(Stage::prefill, *r.instance);
    co_return r;
  }
  // The prompt tokens queued ahead on that engine (every replica's), then
  // this prefill's own: what it waits for, and what it teaches the
  // engine's cost per token when it is done (core/upstream/load_model.hpp).
  const std::int64_t own_tokens = rc.uncached_after_pick();
  const std::int64_t ahead_tokens = r.instance->cluster_queued_tokens();
  InFlightGuard guard(r.instance, own_tokens, &w.registry.load_signal());
  if (picking.owns_lock())
    picking.unlock();
  StageReport report(w.picker, r.instance, ctx);
  StageSpan span = rc.trace.stage("prefill", r.instance->spec.url,
                                  static_cast<unsigned>(rc.tried_prefill.size()));
  if (rc.connector.passes_params() && params != kDefaultPrefillKvParams) {
    span.attribute("pdgate.conversation.cache", "hit");
  } else if (rc.reuse && rc.pick().conversation_id) {
    span.attribute("pdgate.conversation.cache", "miss");
  }
  const UpstreamSpec* decode_spec = rc.decode ? &rc.decode->spec : nullptr;
  r.request_id = rc.connector.stage_request_id(rc.request_id(), &r.instance->spec, decode_spec,
                                               w.request_ids.uuid_hex());
  // Slices of the client's body plus the few edited bytes: the prompt is
  // written from where it was received, never copied.
  SplicedText body = rc.connector.prefill_body(rc.body, rc.index, params);
  // Held while the prefill is sent: its body may be a slice of it.
  std::string responses_body;
  if (rc.api == GenerationApi::responses) {
    responses_body = responses_prefill_body(body.str());
    body = SplicedText(responses_body);
  }
  const auto head = upstream_head(http::verb::post, *r.instance, rc.target, body.size(),
                                  r.request_id, rc.fwd, span.traceparent());
  const auto buffers = body_buffers(body);
  auto& pool = w.pools.for_instance(r.instance);
  auto [err, ex] = co_await UpstreamExchange::start(pool, head, buffers, scope, w.timeouts());
  if (err) {
    r.error = upstream_failure(Stage::prefill, err);
    blame(w, *r.instance, *r.error);
    trace_error(span, *r.error);
    co_return r;
  }
  report.header(ex->status());
  span.status(ex->status());
  if (ex->status() < 200 || ex->status() >= 300) {
    r.error = co_await engine_status_error(Stage::prefill, *ex, *r.instance);
    blame(w, *r.instance, *r.error);
    trace_error(span, *r.error);
    co_return r;
  }
  std::string answer;
  UpstreamError rerr;
  if (auto rest = ex->read_all(answer, kMaxPrefillResponse, rerr))
    rerr = co_await std::move(*rest);
  if (rerr) {
    r.error = upstream_failure(Stage::prefill, rerr);
    blame(w, *r.instance, *r.error);
    trace_error(span, *r.error);
    co_return r;
  }
  report.first_token();
  ex->finish();
  trace_usage(span, answer);
  r.instance->note_request_success();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  r.instance->latency.prefill.observe(elapsed);
  guard.prompt_done();
  r.cached_tokens = prompt_cached_tokens(answer);
  if (const auto usage = last_usage(answer))
    r.prompt_tokens = usage->prompt_tokens;
  note_prefill_time(*r.instance, ahead_tokens + computed_tokens(r, prompt_tokens(ctx), own_tokens),
                    elapsed * 1000);
  // Whole answers only: a stream's prompt_logprobs are not merged.
  if (!rc.facts.stream) {
    if (auto asked = raw_member(rc.body, rc.index, "prompt_logprobs"); asked && *asked != "null")
      r.prompt_logprobs = prompt_logprobs_of(answer);
  }
  if (!rc.connector.passes_params()) {
    if (!rc.connector.parallel())
      r.decode_body = *rc.connector.decode_body(rc.body, rc.index, std::nullopt);
    report.succeeded();
    co_return r;
  }
  auto kv = extract_kv_params(answer);
  if (!kv) {
    r.error = engine_error(ErrorKind::bad_response, "prefill",
                           "prefill stage failed: the engine answered with invalid JSON",
                           "prefill stage failed: " + r.instance->spec.url +
                               " answered with invalid JSON: " + kv.error());
    trace_error(span, *r.error);
    co_return r;
  }
  if (!*kv) {
    // The one token was EOS, or the engine aborted: decode prefills locally.
    spdlog::debug("request {}: prefill returned no kv_transfer_params", rc.request_id());
  }
  // Decode's params as the connector's form says (NIXL: the answer's
  // object relayed for pull, prefill's coordinates only for push).
  auto decode_body = rc.connector.decode_body(
      rc.body, rc.index, *kv ? std::optional<std::string_view>(**kv) : std::nullopt);
  if (!decode_body) {
    r.error = engine_error(
        ErrorKind::bad_response, "prefill", "prefill stage failed: " + decode_body.error(),
        "prefill stage failed: " + r.instance->spec.url + ": " + decode_body.error());
    blame(w, *r.instance, *r.error);
    trace_error(span, *r.error);
    co_return r;
  }
  r.decode_body = std::move(*decode_body);
  report.succeeded();
  co_return r;
}

net::awaitable<std::optional<GatewayError>> prefill_with_failover(RequestContext& rc,
                                                                  std::string_view params) {
  // The last attempt's failure: when the policy then finds no instance
  // to retry on, the engine's error is the answer, not the refusal.
  std::optional<GatewayError> previous;
  for (bool retrying = false;; retrying = true) {
    PrefillAnswer a = co_await run_prefill(rc, params, rc.scope, nullptr);
    // A retried prefill is over: its unit of budget goes back (the decode
    // that follows is no retry).
    if (retrying)
      rc.failover.release();
    if (a.instance && rc.outcome.record)
      rc.outcome.record->prefill = a.instance;  // the last attempt's, failed or not
    if (!a.error) {
      rc.prefill = a.instance;
      rc.prefill_answered_at = std::chrono::steady_clock::now();
      rc.prefill_cached_tokens = a.cached_tokens;
      rc.prefill_prompt_tokens = a.prompt_tokens;
      rc.prefill_prompt_logprobs = std::move(a.prompt_logprobs);
      rc.stage_id = std::move(a.request_id);
      rc.decode_body = std::move(a.decode_body);
      co_return std::nullopt;
    }
    if (a.error->kind == ErrorKind::client_gone)
      co_return a.error;
    if (!a.instance)
      co_return previous&& a.error->kind != ErrorKind::policy_rejected ? previous : a.error;
    rc.tried_prefill.push_back(a.instance.get());
    rc.attempt_failed(Stage::prefill, a.instance, *a.error);
    if (!has_alternative(rc.set->prefill, rc.tried_prefill) ||
        !rc.failover.may_retry(Stage::prefill, *a.error))
      co_return a.error;
    spdlog::info("request {}: prefill on {} failed ({}), retrying on another instance",
                 rc.request_id(), a.instance->spec.url, to_string(a.error->kind));
    previous = std::move(a.error);
  }
}

net::awaitable<bool> prefill_phase(RequestContext& rc) {
  if (rc.connector.names_peers()) {
    // The request id names both peers, so decode is chosen first.
    rc.pick().stage = Stage::decode;
    rc.decode = rc.w.picker.pick(rc.set->decode, rc.pick());
    if (!rc.decode)
      co_return rc.fail(no_instance(Stage::decode, rc.w.picker));
    if (rc.decode->spec.kv_peer.empty())
      co_return rc.fail(missing_kv_peer(Stage::decode, *rc.decode));
  }
  const auto started = std::chrono::steady_clock::now();
  // Multi-turn reuse: the previous turn's decode blocks, taken (once,
  // across replicas) for this prefill to read.
  std::string params(kDefaultPrefillKvParams);
  if (rc.w.conversations) {
    const TurnRequest turn{
        rc.reuse ? rc.pick().conversation_id : std::nullopt,
        conversation_scope(
            rc.req, {rc.client_key != nullptr ? rc.client_key->name : "",
                     rc.w.cfg.conversation_scope_header, rc.w.cfg.conversation_anonymous_reuse}),
        rc.body, &rc.index, rc.is_chat};
    params = co_await prefill_kv_params_for_turn(
        *rc.w.conversations, rc.w.conversation_stores->counters(), turn, rc.turn, rc.request_id());
    if (turn.conversation_id && rc.outcome.record)
      rc.outcome.record->conversation = params != kDefaultPrefillKvParams ? "hit" : "miss";
  }
  if (rc.scope.client_gone())
    co_return rc.fail(
        upstream_failure(Stage::prefill, {UpstreamFailure::aborted, "client went away"}));
  auto error = co_await prefill_with_failover(rc, params);
  rc.prefill_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  co_return !error || rc.fail(std::move(*error));
}

}  // namespace pdgate
