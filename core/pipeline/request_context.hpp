// One client completion request as it passes through the pipeline's
// phases (core/pipeline/pipeline.cpp): what was read from it, what each phase
// decided, and what the failover may still spend. It lives on the heap
// for the routing phases only: once decode's first bytes are in, the relay
// keeps what it needs (DecodeRelay) and the rest (the JSON index, the
// edited bodies) is freed, since a stream can idle for minutes and 10,000
// of them must fit in 100 MiB.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/http.hpp>
#include "core/net/maybe_tls_stream.hpp"

#include "core/base/json_body.hpp"
#include "core/base/json_edit.hpp"
#include "core/net/errors.hpp"
#include "core/observability/tracing.hpp"
#include "core/pipeline/client_key.hpp"
#include "core/pipeline/client_request.hpp"
#include "core/pipeline/engine_call.hpp"
#include "core/pipeline/failover.hpp"
#include "core/pipeline/forwarded_headers.hpp"
#include "core/pipeline/worker.hpp"
#include "core/routing/conversation.hpp"
#include "core/routing/kv_connector.hpp"
#include "core/routing/request_facts.hpp"
#include "core/upstream/load_model.hpp"

namespace pdgate {

// The request as the routing policy sees it (PickContext and the strings
// its views point to). On the heap so that it can outlive routing: the
// decode stage's StageReport hands it to the policy's on_complete when the
// relay ends.
struct RequestView {
  std::string request_id;
  std::string model;
  PickContext ctx;
  // The failed attempts ctx.retries points at once there is one.
  PickRetries retries;
};

struct RequestContext {
  RequestContext(ClientRequest& c, RequestTrace& trace_, GenerationApi api_)
      : w(c.w),
        client(c.client),
        req(c.req),
        scope(c.scope),
        outcome(c.outcome),
        trace(trace_),
        api(api_),
        is_chat(api_ == GenerationApi::chat),
        target(c.req.target()),
        view(std::make_unique<RequestView>()),
        failover(c.w),
        connector(*c.w.connector) {}

  WorkerContext& w;
  MaybeTlsStream& client;
  http::request<http::string_body>& req;
  RequestScope& scope;
  RequestOutcome& outcome;
  RequestTrace& trace;  // outlives the relay too
  const GenerationApi api;
  const bool is_chat;
  // The path the engines are sent: the client's, or (a chat stream resumed
  // token-exact, core/pipeline/resumption.hpp) the completions path.
  std::string_view target;

  // The client's API key (--api-keys), null when keys are off.
  const ClientKey* client_key = nullptr;

  // Validated request (the validate phase).
  std::unique_ptr<RequestView> view;  // moved to the relay once decode answered
  ForwardedHeaders fwd;
  std::string_view body;
  JsonObjectIndex index;
  // The body after the request hook's edits, when it made any (`body`
  // then points here).
  std::string hooked_body;
  RequestFacts facts;
  // The limits the request hook declared (req:rate_limit), checked by the
  // rate-limit phase.
  std::vector<RateLimitDecl> rate_limits;
  std::shared_ptr<const InstanceSet> set;
  // --tokenizer vllm: the prompt's token ids from an engine (the tokenize
  // phase); the pick context points here.
  std::vector<std::uint32_t> token_ids;
  // Multi-turn reuse: whether the connector can reuse a turn's blocks,
  // and (set by the prefill phase) the turn whose answer may be stored.
  bool reuse = false;
  OptionalTurn turn;

  Failover failover;
  const KvConnector& connector;
  // The decode instances are combined P+D ones: no prefill stage.
  bool one_hop = false;
  // A stream whose tokens the gateway counts though the client did not ask
  // for usage: decode is asked for it, and the relay keeps it from the
  // client.
  bool usage_for_gateway = false;

  // What prefill leaves for decode.
  InstancePtr prefill;
  InstancePtr decode;    // chosen before prefill when the connector names both peers
  std::string stage_id;  // the X-Request-Id both stages carry
  SplicedText decode_body;
  // When the prefill decode's params come from answered: its blocks are
  // held for --kv-lease from about then.
  std::chrono::steady_clock::time_point prefill_answered_at{};
  unsigned lease_reruns = 0;  // prefills re-run because the lease ran out
  // Prefill's usage.prompt_tokens_details.cached_tokens: what the client's
  // final usage reports (decode counts the blocks it pulled as cached).
  std::optional<std::uint64_t> prefill_cached_tokens;
  // Prefill's usage.prompt_tokens: what a resumed stream's usage reports
  // as its prompt (core/pipeline/resumption.hpp).
  std::optional<std::uint64_t> prefill_prompt_tokens;
  // Prefill's prompt_logprobs (JSON text) when the client asked for them:
  // decode, which did not compute the prompt, answers null in their place.
  std::optional<std::string> prefill_prompt_logprobs;
  std::vector<const Instance*> tried_prefill;
  std::vector<const Instance*> tried_decode;
  double prefill_seconds = 0;

  // Why the request ended, when a phase ended it (that phase returned
  // false). Here rather than in each phase's return value: the phases are
  // awaited from one frame that lives as long as the relay, and an error
  // is a few hundred bytes.
  std::optional<GatewayError> failure;
  // Ends the request with `e`; returns false, for `return rc.fail(e);`.
  bool fail(GatewayError e) {
    failure = std::move(e);
    return false;
  }

  const std::string& request_id() const { return view->request_id; }
  PickContext& pick() { return view->ctx; }
  // A failed attempt at `stage` on `inst`: the next pick of that stage
  // sees it (ctx.attempt, ctx.failed).
  void attempt_failed(Stage stage, const InstancePtr& inst, const GatewayError& e) {
    note_attempt_failed(view->retries, stage, inst, e);
    view->ctx.retries = &view->retries;
  }

  // The prompt tokens a leg just picked would compute on its instance:
  // the prompt (the engine's count when asked, else the estimate policies
  // use) less what the pick's lookups found cached there. What the leg
  // adds to the instance's queue (InFlightGuard) for as long as it waits.
  std::int64_t uncached_after_pick() {
    return std::max<std::int64_t>(prompt_tokens(pick()) - w.picker.last_pick_cached_tokens(), 0);
  }
  // Set with the decode pick: the uncached tokens of a decode that
  // computes the prompt itself (one hop), 0 after a prefill.
  std::int64_t decode_queued_tokens = 0;
};

}  // namespace pdgate
