#include "core/pipeline/decode_phase.hpp"

#include <spdlog/spdlog.h>

#include "core/pipeline/engine_call.hpp"
#include "core/pipeline/engine_errors.hpp"
#include "core/pipeline/failover.hpp"
#include "core/pipeline/prefill_phase.hpp"
#include "core/routing/kv_params.hpp"
#include "core/upstream/load_model.hpp"

namespace pdgate {

namespace {

// Prefills re-run for one request because prefill's lease ran out before
// decode was sent.
constexpr unsigned kMaxLeaseReruns = 2;

}  // namespace

net::awaitable<Routed> attempt_decode(RequestContext& rc, const InstancePtr& decode,
                                      std::unique_ptr<LegScope> leg_scope) {
  WorkerContext& w = rc.w;
  Routed out;
  auto r = std::make_unique<DecodeRelay>();
  r->leg_scope = std::move(leg_scope);
  r->cached_tokens = rc.prefill_cached_tokens;
  r->prompt_logprobs = rc.prefill_prompt_logprobs;
  RequestScope& scope = r->leg_scope ? r->leg_scope->scope : rc.scope;
  // A decode sent in one hop computes the prompt: it waits for the tokens
  // queued ahead there, like a prefill, and teaches the engine's cost the
  // same way once its first token is in.
  const std::int64_t ahead_tokens =
      rc.decode_queued_tokens > 0 ? decode->cluster_queued_tokens() : 0;
  r->guard = InFlightGuard(decode, rc.decode_queued_tokens, &w.registry.load_signal());
  r->report.emplace(w.picker, decode, rc.pick());
  r->decode = decode;
  r->span =
      rc.trace.stage("decode", decode->spec.url, static_cast<unsigned>(rc.tried_decode.size()));
  // A fresh copy per attempt: the recorder follows this decode's answer.
  if (rc.turn)
    r->conversation = rc.turn->fork();
  const bool stream = rc.facts.stream;
  const auto head = upstream_head(http::verb::post, *decode, rc.target, rc.decode_body.size(),
                                  rc.stage_id, rc.fwd, r->span.traceparent());
  const auto buffers = body_buffers(rc.decode_body);
  auto [err, ex] = co_await UpstreamExchange::start(w.pools.for_instance(decode), head, buffers,
                                                    scope, w.timeouts());
  if (err) {
    out.error = upstream_failure(Stage::decode, err);
    blame(w, *decode, *out.error);
    trace_error(r->span, *out.error);
    co_return out;
  }
  r->report->header(ex->status());
  r->span.status(ex->status());
  if (ex->status() < 200 || ex->status() >= 300) {
    out.error = co_await engine_status_error(Stage::decode, *ex, *decode);
    blame(w, *decode, *out.error);
    trace_error(r->span, *out.error);
    co_return out;
  }
  UpstreamError rerr;
  if (stream) {
    const bool responses = rc.api == GenerationApi::responses;
    r->stream.emplace(w, *ex, *decode, rc.request_id(), r->conversation,
                      rc.facts.include_usage || rc.usage_for_gateway || responses,
                      rc.usage_for_gateway, responses, &r->cached_tokens);
    // A Responses stream opens with events that carry no token
    // (response.created, ...): read on to the first token, a bounded
    // number of bytes, so that the time to first token is that.
    constexpr std::size_t kMaxPreamble = 64u << 10;
    while (!rerr && !r->stream->done() &&
           (r->first.empty() ||
            (responses && !r->stream->first_event_at() && r->first.size() < kMaxPreamble)))
      rerr = co_await r->stream->read_into(r->first);
    r->first_token_at = r->stream->first_event_at();
  } else {
    if (auto rest =
            ex->read_all(r->first, std::max<std::size_t>(w.cfg.max_body_bytes, 64u << 20), rerr))
      rerr = co_await std::move(*rest);
    if (!rerr) {
      ex->finish();
      r->first_token_at = std::chrono::steady_clock::now();
      trace_usage(r->span, r->first);
    }
  }
  if (rerr) {
    out.error = upstream_failure(Stage::decode, rerr);
    blame(w, *decode, *out.error);
    trace_error(r->span, *out.error);
    co_return out;
  }
  decode->note_request_success();
  r->guard.prompt_done();
  if (r->first_token_at) {
    r->report->first_token(*r->first_token_at);
    const double ttft_s =
        std::chrono::duration<double>(*r->first_token_at - r->report->started()).count();
    if (rc.decode_queued_tokens > 0)
      note_prefill_time(*decode, ahead_tokens + rc.decode_queued_tokens, ttft_s * 1000);
    auto& ttft = stream ? decode->latency.ttft_stream : decode->latency.ttft_whole;
    ttft.observe(ttft_s);
  }
  // The decode stage counts as succeeded once its first bytes are in:
  // what happens while relaying is the stream's own business.
  r->report->succeeded();
  r->ex = std::move(ex);
  out.relay = std::move(r);
  co_return out;
}

void note_decode_answered(RequestContext& rc, DecodeRelay& relay) {
  WorkerContext& w = rc.w;
  // Nothing is retried once decode answered: a retry that got here is
  // over, and the stream that follows (minutes, maybe) holds no budget.
  rc.failover.release();
  if (const auto at = relay.first_token_at) {
    const auto since_received = *at - rc.outcome.received;
    if (rc.outcome.record) {
      rc.outcome.record->ttft =
          std::chrono::duration_cast<std::chrono::microseconds>(since_received);
    }
    if (w.metrics) {
      auto& h = rc.facts.stream ? w.metrics->first_token_stream : w.metrics->first_token_whole;
      h.observe(std::chrono::duration<double>(since_received).count());
    }
  }
  relay.cached_tokens = rc.prefill_cached_tokens;
  relay.prompt_logprobs = rc.prefill_prompt_logprobs;
  relay.prompt_tokens = rc.prefill_prompt_tokens;
  relay.view = std::move(rc.view);
  rc.failure.reset();  // an earlier attempt's
}

net::awaitable<std::unique_ptr<DecodeRelay>> decode_phase(RequestContext& rc) {
  WorkerContext& w = rc.w;
  for (;;) {
    rc.pick().stage = Stage::decode;
    rc.pick().chosen_prefill = rc.prefill.get();
    if (!rc.decode || !rc.tried_decode.empty()) {
      rc.decode = w.picker.pick(untried(rc.set->decode, rc.tried_decode), rc.pick());
      rc.decode_queued_tokens = rc.prefill ? 0 : rc.uncached_after_pick();
    }
    if (!rc.decode) {
      // On a retry the failed attempt's error stays the answer (the
      // engine's 500, not the policy's refusal to go elsewhere), unless
      // the policy refused with a status of its own.
      GatewayError none = no_instance(Stage::decode, w.picker);
      if (!rc.failure || none.kind == ErrorKind::policy_rejected)
        rc.fail(std::move(none));
      co_return nullptr;
    }
    if (rc.outcome.record)
      rc.outcome.record->decode = rc.decode;  // the last attempt's, failed or not
    const auto decode_started = std::chrono::steady_clock::now();
    if (w.metrics && rc.tried_decode.empty()) {
      w.metrics->overhead_seconds.observe(
          std::chrono::duration<double>(decode_started - rc.outcome.received).count() -
          rc.prefill_seconds);
    }
    if (!rc.one_hop && rc.prefill && rc.connector.passes_params()) {
      const auto handoff = decode_started - rc.prefill_answered_at;
      const auto lease = w.cfg.kv_lease;
      if (lease.count() > 0 && handoff >= lease) {
        // Prefill has freed (or is about to free) the blocks these params
        // name: decode would find nothing. A fresh prefill, a bounded number
        // of times (a decode pick slower than the lease every time would
        // loop forever).
        if (w.metrics)
          w.metrics->kv_lease_expired.fetch_add(1, std::memory_order_relaxed);
        if (++rc.lease_reruns > kMaxLeaseReruns) {
          GatewayError g = gateway_error(
              ErrorKind::overloaded, "prefill's KV lease ran out before decode could be sent",
              "prefill's KV lease (--kv-lease) ran out " + std::to_string(kMaxLeaseReruns + 1) +
                  " times before decode could be sent");
          g.stage = "decode";
          rc.fail(std::move(g));
          co_return nullptr;
        }
        spdlog::info(
            "request {}: prefill's KV lease ran out before decode was sent ({} ms); "
            "prefilling again",
            rc.request_id(),
            std::chrono::duration_cast<std::chrono::milliseconds>(handoff).count());
        rc.tried_prefill.clear();
        if (auto e = co_await prefill_with_failover(rc, kDefaultPrefillKvParams)) {
          rc.fail(std::move(*e));
          co_return nullptr;
        }
        continue;
      }
      if (w.metrics)
        w.metrics->kv_handoff_seconds.observe(std::chrono::duration<double>(handoff).count());
    }
    Routed a = co_await attempt_decode(rc, rc.decode, nullptr);
    if (a.relay) {
      note_decode_answered(rc, *a.relay);
      co_return std::move(a.relay);
    }
    rc.failure = std::move(a.error);
    if (rc.failure->kind == ErrorKind::client_gone)
      co_return nullptr;
    rc.tried_decode.push_back(rc.decode.get());
    rc.attempt_failed(Stage::decode, rc.decode, *rc.failure);
    if (rc.connector.names_peers() || !has_alternative(rc.set->decode, rc.tried_decode) ||
        !rc.failover.may_retry(Stage::decode, *rc.failure))
      co_return nullptr;
    spdlog::info("request {}: decode on {} failed before its first byte ({}), retrying",
                 rc.request_id(), rc.decode->spec.url, to_string(rc.failure->kind));
    if (rc.one_hop || !rc.failure->reached_engine)
      continue;
    // The first prefill's blocks were meant for (and may have been pulled
    // by) the failed decode: the next one gets fresh ones.
    rc.tried_prefill.clear();
    if (auto e = co_await prefill_with_failover(rc, kDefaultPrefillKvParams)) {
      rc.fail(std::move(*e));
      co_return nullptr;
    }
  }
}

}  // namespace pdgate
