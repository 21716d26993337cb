#include "core/pipeline/parallel_legs.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/this_coro.hpp>

#include "core/base/child_group.hpp"
#include "core/pipeline/decode_phase.hpp"
#include "core/pipeline/engine_errors.hpp"
#include "core/pipeline/prefill_phase.hpp"
#include "core/routing/kv_params.hpp"
#include "core/upstream/mooncake_bootstrap.hpp"

namespace pdgate {

namespace {

// What the prefill leg leaves, and whom it may abort.
struct PrefillLeg {
  explicit PrefillLeg(RequestScope& parent) : scope(parent) {}
  LegScope scope;
  // The decode leg's scope while decode has not answered: a prefill that
  // fails aborts it there (decode would wait for KV that never comes).
  RequestScope* decode_waiting = nullptr;
  std::optional<GatewayError> error;
  std::optional<std::uint64_t> cached_tokens;
  std::optional<std::uint64_t> prompt_tokens;
  bool done = false;
};

net::awaitable<void> run_prefill_leg(RequestContext& rc, std::string params, InstancePtr prefill,
                                     PrefillLeg& leg) {
  PrefillAnswer a = co_await run_prefill(rc, params, leg.scope.scope, std::move(prefill));
  leg.done = true;
  leg.cached_tokens = a.cached_tokens;
  leg.prompt_tokens = a.prompt_tokens;
  leg.error = std::move(a.error);
  if (leg.error && leg.error->kind != ErrorKind::client_gone && leg.decode_waiting) {
    spdlog::info("request {}: prefill leg failed ({}); aborting the decode leg", rc.request_id(),
                 to_string(leg.error->kind));
    leg.decode_waiting->on_client_gone();
  }
}

// One pair of legs' end: the relay, or the failure and the leg that failed
// first (the other was aborted because of it).
struct PairOutcome {
  std::unique_ptr<DecodeRelay> relay;
  std::optional<GatewayError> error;
  InstancePtr failed;  // the instance of the leg that failed first
  Stage failed_stage = Stage::decode;
};

net::awaitable<PairOutcome> run_pair(RequestContext& rc) {
  PairOutcome out;
  WorkerContext& w = rc.w;
  const auto started = std::chrono::steady_clock::now();
  const auto executor = co_await net::this_coro::executor;

  InstancePtr prefill = pick_prefill(rc);
  if (!prefill) {
    out.error = no_instance(Stage::prefill, w.picker);
    co_return out;
  }
  if (rc.outcome.record)
    rc.outcome.record->prefill = prefill;
  rc.pick().stage = Stage::decode;
  rc.pick().chosen_prefill = prefill.get();
  rc.decode = w.picker.pick(untried(rc.set->decode, rc.tried_decode), rc.pick());
  rc.decode_queued_tokens = 0;
  if (!rc.decode) {
    out.error = no_instance(Stage::decode, w.picker);
    co_return out;
  }
  if (rc.outcome.record)
    rc.outcome.record->decode = rc.decode;

  // Decode names prefill's engine as its bootstrap server does. Rank 0
  // until legs are pinned to data-parallel ranks.
  const std::uint16_t port = w.cfg.mooncake_bootstrap_port;
  auto engine = co_await w.mooncake.engine_id(executor, prefill->spec, port,
                                              prefill->spec.dp_rank.value_or(0));
  if (rc.scope.client_gone()) {
    out.error = upstream_failure(Stage::prefill, {UpstreamFailure::aborted, "client went away"});
    co_return out;
  }
  if (!engine) {
    GatewayError g = engine_error(
        ErrorKind::bad_response, "prefill",
        "prefill stage failed: the engine's Mooncake bootstrap server named no engine id",
        "prefill stage failed: " + engine.error());
    blame(w, *prefill, g);
    out.error = std::move(g);
    out.failed = prefill;
    out.failed_stage = Stage::prefill;
    co_return out;
  }
  const MintedTransfer minted{"xfer-" + w.request_ids.uuid_hex(),
                              MooncakeBootstrap::address(prefill->spec, port), std::move(*engine)};
  rc.prefill = prefill;
  rc.stage_id = rc.request_id();
  rc.decode_body = rc.connector.decode_body(rc.body, rc.index, minted);

  // Both legs now; the decode leg's scope goes to its relay, the prefill
  // leg's ends here (the phase waits for it).
  PrefillLeg leg(rc.scope);
  auto decode_scope = std::make_unique<LegScope>(rc.scope);
  leg.decode_waiting = &decode_scope->scope;
  ChildGroup children(executor, [&leg] { leg.scope.scope.on_client_gone(); });
  children.spawn(run_prefill_leg(rc, mooncake_prefill_params(minted.transfer_id), prefill, leg));
  Routed a = co_await attempt_decode(rc, rc.decode, std::move(decode_scope));
  // Decode answered or failed: the prefill leg can no longer abort it (its
  // scope now lives with the relay, or is gone).
  leg.decode_waiting = nullptr;
  if (!a.relay && !leg.done) {
    spdlog::info("request {}: decode leg failed; aborting the prefill leg", rc.request_id());
    leg.scope.scope.on_client_gone();
  }
  co_await children.wait();
  rc.prefill_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (a.relay) {
    if (leg.error && leg.error->kind != ErrorKind::client_gone) {
      // Decode had its KV (it answered), so the prefill's own answer was
      // what failed; the client's answer stands.
      spdlog::warn("request {}: prefill leg failed after decode answered: {}", rc.request_id(),
                   leg.error->detail.empty() ? leg.error->message : leg.error->detail);
    }
    rc.prefill_cached_tokens = leg.cached_tokens;
    rc.prefill_prompt_tokens = leg.prompt_tokens;
    out.relay = std::move(a.relay);
    co_return out;
  }
  if (leg.error && leg.error->kind != ErrorKind::client_gone &&
      a.error->kind == ErrorKind::client_gone) {
    // Prefill failed first: decode was aborted because of it.
    out.error = std::move(leg.error);
    out.failed = prefill;
    out.failed_stage = Stage::prefill;
  } else {
    out.error = std::move(a.error);
    out.failed = rc.decode;
  }
  co_return out;
}

}  // namespace

net::awaitable<std::unique_ptr<DecodeRelay>> parallel_legs_phase(RequestContext& rc) {
  // The last pair's failure, the answer when no instance is picked for a
  // retry (as in prefill_with_failover).
  std::optional<GatewayError> previous;
  for (bool retrying = false;; retrying = true) {
    PairOutcome o = co_await run_pair(rc);
    // A retried pair is over: its unit of budget goes back.
    if (retrying)
      rc.failover.release();
    if (o.relay) {
      note_decode_answered(rc, *o.relay);
      co_return std::move(o.relay);
    }
    GatewayError& e = *o.error;
    if (e.kind == ErrorKind::client_gone || !o.failed) {
      const bool keep = previous && !o.failed && e.kind != ErrorKind::policy_rejected &&
                        e.kind != ErrorKind::client_gone;
      rc.fail(keep ? std::move(*previous) : std::move(e));
      co_return nullptr;
    }
    // The failed leg's instance is not tried again (the other leg was
    // aborted, not at fault); the existing failover rules say whether to.
    const bool prefill_failed = o.failed_stage == Stage::prefill;
    auto& tried = prefill_failed ? rc.tried_prefill : rc.tried_decode;
    tried.push_back(o.failed.get());
    rc.attempt_failed(o.failed_stage, o.failed, e);
    if (!has_alternative(prefill_failed ? rc.set->prefill : rc.set->decode, tried) ||
        !rc.failover.may_retry(o.failed_stage, e)) {
      rc.fail(std::move(e));
      co_return nullptr;
    }
    spdlog::info("request {}: {} leg on {} failed ({}), both legs again on other instances",
                 rc.request_id(), to_string(o.failed_stage), o.failed->spec.url, to_string(e.kind));
    previous = std::move(e);
  }
}

}  // namespace pdgate
