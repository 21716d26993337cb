#include "core/pipeline/pipeline.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>
#include <boost/beast/core/string.hpp>
#include <nlohmann/json.hpp>

#include "core/base/http_tokens.hpp"
#include "core/base/json_edit.hpp"
#include "core/net/http_head.hpp"
#include "core/net/response_writer.hpp"
#include "core/observability/usage.hpp"
#include "core/pipeline/admit_phase.hpp"
#include "core/pipeline/decode_phase.hpp"
#include "core/pipeline/encode_phase.hpp"
#include "core/pipeline/engine_call.hpp"
#include "core/pipeline/engine_errors.hpp"
#include "core/pipeline/failover.hpp"
#include "core/pipeline/forwarded_headers.hpp"
#include "core/pipeline/parallel_legs.hpp"
#include "core/pipeline/prefill_phase.hpp"
#include "core/pipeline/rate_limit_phase.hpp"
#include "core/pipeline/relay.hpp"
#include "core/pipeline/request_context.hpp"
#include "core/pipeline/request_hook_phase.hpp"
#include "core/pipeline/tokenize_phase.hpp"
#include "core/routing/conversation.hpp"
#include "core/routing/request_hook.hpp"

namespace pdgate {

namespace {

constexpr std::size_t kMaxRequestIdLength = 256;

// "application/json", optionally with parameters ("; charset=utf-8").
bool is_json_content_type(std::string_view ct) {
  return beast::iequals(http_tokens::trim_ows(ct.substr(0, ct.find(';'))), "application/json");
}

// The client's X-Request-Id when it is a sane token, else a new UUID.
// Engines key requests by it, so it must be unique and printable.
std::string request_id_for(WorkerContext& w, const http::request<http::string_body>& req) {
  // The first X-Request-Id, found by a pass over the fields rather than
  // find(): Beast has no enum for it, so find() hashed the name and walked
  // the field set on every request, most of which do not send one.
  for (const auto& f : req) {
    if (f.name_string().size() != 12 || !beast::iequals(f.name_string(), "x-request-id"))
      continue;
    const std::string_view v = f.value();
    bool ok = !v.empty() && v.size() <= kMaxRequestIdLength;
    for (char c : v)
      ok = ok && c > 0x20 && c < 0x7f;
    if (ok)
      return std::string(v);
    break;
  }
  return w.request_ids.uuid();
}

}  // namespace

void policy_headers(const void* source, void* user, PickContext::HeaderEmit emit) {
  const auto& req = *static_cast<const http::request<http::string_body>*>(source);
  std::string low;
  for (const auto& f : req) {
    const auto name = f.name();
    if (name == http::field::authorization || name == http::field::cookie ||
        name == http::field::proxy_authorization)
      continue;
    low.assign(f.name_string());
    for (auto& c : low)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    emit(user, low, f.value());
  }
}

namespace {

// The server span's name and the attributes known when the request
// arrives (OpenTelemetry's HTTP server conventions, plus pdgate's id).
void name_server_span(RequestTrace& trace, const http::request<http::string_body>& req,
                      const std::string& request_id) {
  const std::string_view target = req.target();
  const std::string_view path = target.substr(0, target.find('?'));
  const std::string method(req.method_string());
  trace.name(method + " " + std::string(path));
  trace.attribute("http.request.method", method);
  trace.attribute("url.path", std::string(path));
  trace.attribute("pdgate.request_id", request_id);
}

// Reads what the later phases and the policies need from `body` (the
// client's, or a resumed leg's continuation of it, which must outlive
// rc).
bool read_request(RequestContext& rc, std::string_view body) {
  rc.body = body;
  auto index = index_json_object(rc.body);
  if (!index)
    return rc.fail(
        client_error(ErrorKind::bad_request, "request body is not valid JSON: " + index.error()));
  rc.index = std::move(*index);
  auto facts = read_facts(rc.body, rc.index, rc.api);
  if (!facts)
    return rc.fail(client_error(ErrorKind::bad_request, facts.error()));
  rc.facts = std::move(*facts);

  rc.fwd = forwarded_headers(rc.w, rc.req, rc.client, rc.trace);
  rc.set = rc.w.registry.snapshot();
  PickContext& ctx = rc.pick();
  rc.view->model = rc.facts.model;
  ctx.model = rc.view->model;
  ctx.stream = rc.facts.stream;
  ctx.is_chat = rc.is_chat;
  ctx.prompt_raw = raw_member(rc.body, rc.index, prompt_member(rc.api)).value_or("");
  // The body's conversation_id, else the X-Conversation-Id header.
  ctx.conversation_id = conversation_key(rc.req, rc.facts);
  // Policies may route on any request header but the credentials, listed
  // only if a policy reads them (policy_headers).
  ctx.header_source = &rc.req;
  ctx.for_each_header = &policy_headers;
  ctx.request_id = rc.request_id();
  ctx.serial = ++rc.w.last_request_serial;
  return true;
}

// The request is one pdgate can route: reads what the later phases and
// the policies need.
bool validate_phase(RequestContext& rc) {
  const auto ct = first_field(rc.req, http::field::content_type);
  if (!ct || !is_json_content_type(*ct)) {
    return rc.fail(client_error(ErrorKind::unsupported_media_type,
                                "Unsupported Media Type: Content-Type must be application/json"));
  }
  return read_request(rc, rc.req.body());
}

// The tokens a completion may use, held against its key's tokens per
// minute until its real count is known: the prompt's estimate and the
// most it may generate (max_tokens or a chat's max_completion_tokens, the
// larger when both are set), or --token-reserve when it sets neither.
std::uint64_t token_reservation(const RequestContext& rc) {
  const RequestFacts& f = rc.facts;
  std::optional<std::int64_t> most = f.max_tokens;
  if (f.max_completion_tokens && (!most || *f.max_completion_tokens > *most))
    most = f.max_completion_tokens;
  if (rc.api == GenerationApi::responses)
    most = f.max_output_tokens;
  // Bounded, so that sums of reservations cannot overflow.
  constexpr std::uint64_t kMost = std::uint64_t{1} << 40;
  const std::uint64_t completion =
      most ? std::min(static_cast<std::uint64_t>(*most), kMost) : rc.w.cfg.token_reserve;
  return estimated_prompt_tokens(f.prompt_bytes) + completion;
}

// A stream's tokens are known only from its usage event. When its key
// counts tokens and the client did not ask for usage, decode is asked for
// it (stream_options.include_usage) and the relay keeps that event from
// the client, which gets the stream it asked for.
// (A Responses stream needs no asking: its response.completed event
// always carries the usage.)
bool ask_decode_for_usage(RequestContext& rc) {
  if (rc.api == GenerationApi::responses)
    return true;
  if (!rc.facts.stream || rc.facts.include_usage || rc.client_key == nullptr ||
      rc.client_key->limits.tokens_per_minute == 0)
    return true;
  nlohmann::json options = nlohmann::json::object();
  if (const auto raw = raw_member(rc.body, rc.index, "stream_options"); raw && *raw != "null") {
    // A small object the validate phase found well-formed.
    options = nlohmann::json::parse(*raw, nullptr, false);
    if (!options.is_object())
      options = nlohmann::json::object();
  }
  options["include_usage"] = true;
  JsonBodyEditor editor(rc.body, rc.index);
  editor.set("stream_options", options.dump());
  rc.usage_for_gateway = true;
  return use_edited_body(rc, editor.render(), "asking decode for usage");
}

// Whether a stream may be resumed if its decode breaks off: streamed chat
// and completions (a Responses stream's events are the engine's own
// state machine), with --decode-migrations above 0.
bool resumes(const Config& cfg, GenerationApi api, bool stream) {
  return stream && cfg.decode_migrations > 0 && api != GenerationApi::responses;
}

// --resume-token-ids: a resumable stream asks its engines for token ids
// (return_token_ids), so a resumed leg can go on token-exact; the relay
// cuts them from the client's stream unless the client asked for them.
bool ask_for_token_ids(RequestContext& rc, bool& strip) {
  strip = false;
  if (!rc.w.cfg.resume_token_ids || !resumes(rc.w.cfg, rc.api, rc.facts.stream) ||
      bool_member(rc.body, rc.index, "return_token_ids").value_or(false))
    return true;
  JsonBodyEditor editor(rc.body, rc.index);
  editor.set("return_token_ids", "true");
  strip = true;
  return use_edited_body(rc, editor.render(), "asking for token ids");
}

// What routing decided, for the access log.
// (A routed request's view has moved to the relay: its id is passed.)
void note_routing(RequestContext& rc, const std::string& request_id) {
  RequestRecord* r = rc.outcome.record.get();
  if (r == nullptr)
    return;
  r->retries = rc.failover.retries();
  r->stream = rc.facts.stream;
  r->request_id = request_id;
  r->model = rc.facts.model;
  // As this worker's picker runs them; else as its configuration names
  // them (a reload may have changed them).
  const Config& c = rc.w.cfg;
  StagePolicies& p = r->policies;
  const auto policy = [&](Stage s, const std::string& configured, std::string& name,
                          std::string& version) {
    std::tie(name, version) = rc.w.picker.policy_of(s);
    if (name.empty())
      name = configured.empty() ? c.policy : configured;
  };
  policy(Stage::encode, c.policy_encode, p.encode, p.encode_version);
  policy(Stage::prefill, c.policy_prefill, p.prefill, p.prefill_version);
  policy(Stage::decode, c.policy_decode, p.decode, p.decode_version);
}

}  // namespace

net::awaitable<bool> finish(ClientRequest& c, const std::string& request_id,
                            const GatewayError& err) {
  const http::request<http::string_body>& req = c.req;
  RequestOutcome& outcome = c.outcome;
  outcome.stage = err.stage;
  if (outcome.record)
    outcome.record->reject = err.reason;
  const unsigned status = status_of(err);
  const std::string& logged = err.detail.empty() ? err.message : err.detail;
  if (err.kind == ErrorKind::client_gone || c.scope.client_gone()) {
    // 499 (as nginx logs it): nobody to answer.
    outcome.status = 0;
    spdlog::debug("request {}: the client left during {}", request_id, err.stage);
    co_return false;
  }
  outcome.status = status;
  if (status >= 500) {
    spdlog::warn("request {} -> {} ({}, {}): {}", request_id, status, to_string(err.kind),
                 to_string(err.source), logged);
  } else {
    spdlog::debug("request {} -> {} ({}): {}", request_id, status, to_string(err.kind), logged);
  }
  auto res = make_error_response(err, req.version(), req.keep_alive(), c.w.cfg.verbose_errors);
  if (!request_id.empty())
    res.set("X-Request-Id", request_id);
  outcome.count_sent(res.body().size());
  co_return co_await write_response(c.client, res) && req.keep_alive();
}

namespace {

// Whether a phase has work to do for this request. (A phase with nothing
// to do is not entered: each coroutine call costs a frame allocation.)
// (vLLM's /tokenize takes a prompt or messages, not a Responses input.)
bool tokenizes(const RequestContext& rc) {
  return rc.w.cfg.tokenizer == "vllm" && rc.api != GenerationApi::responses;
}
bool has_media_to_encode(const RequestContext& rc) {
  return rc.is_chat && !rc.set->encode.empty();
}

// One hop, in place of prefill: the decode instances are combined P+D
// ones, and get the client's body as it is.
void prepare_one_hop(RequestContext& rc) {
  rc.stage_id = rc.request_id();
  rc.decode_body = *rc.connector.decode_body(rc.body, rc.index, std::nullopt);
}

// The phases that take an admitted request to its engines, up to decode's
// first bytes: the relay, or null with rc.failure set.
net::awaitable<std::unique_ptr<DecodeRelay>> route_phases(RequestContext& rc) {
  bool on = true;
  if (tokenizes(rc))
    co_await tokenize_phase(rc);
  if (has_media_to_encode(rc))
    on = co_await encode_phase(rc);
  // The connector's form says when the legs run: decode after prefill
  // answered, or both at once (Mooncake).
  const bool parallel = !rc.one_hop && rc.connector.parallel();
  if (on && rc.one_hop)
    prepare_one_hop(rc);
  else if (on && !parallel)
    on = co_await prefill_phase(rc);
  std::unique_ptr<DecodeRelay> relay;
  // (Not a conditional expression: GCC 12 runs both co_awaits of one.)
  if (on && parallel)
    relay = co_await parallel_legs_phase(rc);
  else if (on)
    relay = co_await decode_phase(rc);
  co_return relay;
}

// Notes a decode the stream left in its access-log record.
void append_migrated_from(RequestRecord& r, const std::string& url) {
  if (!r.migrated_from.empty())
    r.migrated_from += ',';
  r.migrated_from += url;
}

// A resumed leg for the stream `rs`: the continuation of the client's
// request (core/pipeline/resumption.hpp), routed as a request of its own
// (prefill again, the policies' picks with ctx.migrations set) to a decode
// not in `excluded` (the one that broke off, and any leg of this move that
// failed), under the id `<id>-r<n>`, within the retry budget. Null, with
// `why` set, when there is none; then `again` says whether the leg failed
// at an engine before its first event (its decode added to `excluded`),
// which another decode may not.
net::awaitable<std::unique_ptr<DecodeRelay>> resume_leg(
    ClientRequest& c, RequestTrace& trace, GenerationApi api, const ClientKey* key,
    const std::string& request_id, StreamResume& rs, std::vector<const Instance*>& excluded,
    std::string& why, bool& attempted, bool& again) {
  again = false;
  const std::string_view original = c.req.body();
  auto index = index_json_object(original);
  if (!index) {
    why = "the request body no longer parses";
    co_return nullptr;
  }
  bool completion_leg = false;
  auto body = continuation_body(original, *index, api == GenerationApi::chat, rs.transcript, why,
                                &completion_leg);
  if (!body)
    co_return nullptr;
  // A chat stream resumed token-exact goes on as a completion of its ids.
  const GenerationApi leg_api = completion_leg ? GenerationApi::completions : api;
  auto rc = std::make_unique<RequestContext>(c, trace, leg_api);
  if (completion_leg)
    rc->target = "/v1/completions";
  rs.completion_leg = completion_leg;
  rc->client_key = key;
  rc->view->request_id = request_id + "-r" + std::to_string(rs.migrations + 1);
  if (!read_request(*rc, *body)) {
    why = rc->failure->message;
    co_return nullptr;
  }
  rc->pick().migrations = rs.migrations + 1;
  rc->tried_decode = excluded;
  // No other decode: no prefill is spent on a leg that cannot be sent.
  if (!has_alternative(rc->set->decode, rc->tried_decode)) {
    why = "no other decode instance is in service";
    co_return nullptr;
  }
  GatewayError failed = upstream_failure(Stage::decode, *rs.broke);
  failed.retriable = true;
  failed.reached_engine = true;
  // A drain's move is the operator's plan, not a retry after a failure:
  // it does not wait for the retry budget (which would cut the streams
  // past it off).
  if (rs.reason != BreakReason::drain && !rc->failover.may_retry(Stage::decode, failed)) {
    why = "the retry budget (--retry-budget) is spent";
    co_return nullptr;
  }
  attempted = true;
  std::unique_ptr<DecodeRelay> relay;
  if (request_hook_phase(*rc)) {
    // A completion leg's prompt is no chat turn to store for the next.
    if (completion_leg)
      rc->reuse = false;
    relay = co_await route_phases(*rc);
  }
  if (!relay) {
    const GatewayError& e = *rc->failure;
    why = e.detail.empty() ? e.message : e.detail;
    again =
        e.source == ErrorSource::engine && e.retriable && rc->tried_decode.size() > excluded.size();
    excluded = rc->tried_decode;
  }
  co_return relay;
}

// Relays a stream that may be resumed: each time its decode breaks off,
// the continuation goes to another decode and the stream goes on, until
// it ends or may not be resumed again (--decode-migrations, the budget,
// a policy, a request that cannot be continued): then the error event.
net::awaitable<bool> relay_resumable(ClientRequest& c, RequestTrace& trace, GenerationApi api,
                                     const ClientKey* key, bool client_usage, bool strip_ids,
                                     std::unique_ptr<DecodeRelay>& relay) {
  WorkerContext& w = c.w;
  StreamResume rs(api == GenerationApi::chat);
  rs.client_usage = client_usage;
  rs.strip_ids = strip_ids;
  const ResumableListing listed(w, rs);
  const std::string request_id = relay->view->request_id;
  // The original prompt's length (a resumed leg's prompt holds the answer).
  const std::optional<std::uint64_t> prompt_tokens = relay->prompt_tokens;
  bool keep = co_await relay_answer(c, *relay, &rs);
  while (rs.broke && !c.scope.client_gone()) {
    const BreakReason reason = rs.reason;
    // A drain cut its own engine off: no failure of the engine's.
    if (reason != BreakReason::drain)
      note_broken(w, *relay, *rs.broke);
    std::string why;
    bool attempted = false;
    std::unique_ptr<DecodeRelay> next;
    // The decodes this move left or tried in vain, in order.
    std::vector<const Instance*> excluded;
    if (rs.transcript.saw_done() || rs.transcript.finished()) {
      why = "the answer was complete";
    } else if (rs.migrations >= w.cfg.decode_migrations) {
      why = "--decode-migrations " + std::to_string(w.cfg.decode_migrations) + " reached";
    } else {
      spdlog::info("request {}: decode {} broke off after {} tokens ({}: {}); resuming elsewhere",
                   request_id, relay->decode->spec.url, rs.transcript.tokens(), to_string(reason),
                   rs.broke->detail);
      // A leg that fails before its first event (its decode died too, as
      // when two are killed close together) is followed by another on a
      // decode neither used, as long as moves are left: each leg counts
      // as one of --decode-migrations and takes its own retry budget.
      excluded = {relay->decode.get()};
      for (;;) {
        bool again = false;
        next = co_await resume_leg(c, trace, api, key, request_id, rs, excluded, why, attempted,
                                   again);
        if (next || !again)
          break;
        ++rs.migrations;
        if (rs.migrations >= w.cfg.decode_migrations)
          break;
        spdlog::info(
            "request {}: resumed leg failed before its first event ({}); trying another "
            "decode",
            request_id, why);
      }
    }
    if (!next) {
      count_migration(w, reason, attempted ? MigrationOutcome::failed : MigrationOutcome::refused);
      spdlog::info("request {}: stream not resumed: {}", request_id, why);
      keep = co_await end_broken_stream(c, rs);
      break;
    }
    count_migration(w, reason, MigrationOutcome::resumed);
    ++rs.migrations;
    if (RequestRecord* r = c.outcome.record.get()) {
      r->migrations = rs.migrations;
      for (const Instance* left : excluded)
        append_migrated_from(*r, left->spec.url);
    }
    rs.broke.reset();
    rs.leg.emplace(rs.transcript, prompt_tokens, client_usage, rs.completion_leg);
    relay = std::move(next);
    keep = co_await relay_answer(c, *relay, &rs);
  }
  co_return keep;
}

}  // namespace

net::awaitable<bool> serve_completion(ClientRequest& c, GenerationApi api) {
  WorkerContext& w = c.w;
  // Before the relay: its decode span ends before the server span.
  RequestTrace trace(w.trace_ids, w.spans, w.cfg.trace_sample_ratio, c.req);
  // Held until the answer is written: the key's concurrency slot.
  ClientAdmission admission;
  // What the routing phases read and decide; freed before the relay, since
  // a stream can idle for minutes.
  auto rc = std::make_unique<RequestContext>(c, trace, api);
  rc->view->request_id = request_id_for(w, c.req);
  if (trace.recording())
    name_server_span(trace, c.req, rc->request_id());

  // The phases of a completion, in order. Each one moves the request on
  // (true) or ends it, leaving why in rc->failure.
  bool on = authenticate(w, c.req, admission, rc->failure);
  rc->client_key = admission.key();
  if (rc->client_key != nullptr && c.outcome.record)
    c.outcome.record->tenant = rc->client_key->name;
  on = on && validate_phase(*rc);
  // Limits once the body says what the request may generate.
  bool admitted = on || rc->client_key != nullptr || w.client_keys == nullptr;
  if (on && rc->client_key != nullptr) {
    on = co_await admit_limits(w, rc->request_id(), token_reservation(*rc), admission, rc->failure);
    admitted = on;
  }
  on = on && request_hook_phase(*rc);
  // The limits the hook declared, checked and counted now (a resumed leg
  // below is the same client request: its hook's limits are not counted
  // again).
  if (on && !rc->rate_limits.empty())
    on = co_await rate_limit_phase(*rc);
  // Multi-turn reuse checks a turn's exact prompt or messages; a Responses
  // turn continues by previous_response_id, which the engines resolve.
  if (api == GenerationApi::responses)
    rc->reuse = false;
  on = on && ask_decode_for_usage(*rc);
  bool strip_ids = false;
  on = on && ask_for_token_ids(*rc, strip_ids);
  std::unique_ptr<DecodeRelay> relay;
  if (on)
    relay = co_await route_phases(*rc);
  // ... and relay_answer() below, once decode's first bytes are in.
  if (admitted)
    note_routing(*rc, relay ? relay->view->request_id : rc->request_id());
  if (!relay) {
    const bool keep = co_await finish(c, rc->request_id(), *rc->failure);
    trace.finish(c.outcome.status, c.outcome.stage);
    co_return keep;
  }
  const bool resumable = resumes(w.cfg, api, rc->facts.stream) && relay->stream;
  const bool client_usage = rc->facts.include_usage;
  const ClientKey* const key = rc->client_key;
  rc.reset();
  c.outcome.status = relay->ex->status();
  c.outcome.stage = "decode";
  // (Not a conditional expression: GCC 12 runs both co_awaits of one.)
  bool keep = false;
  if (resumable)
    keep = co_await relay_resumable(c, trace, api, key, client_usage, strip_ids, relay);
  else
    keep = co_await relay_answer(c, *relay);
  trace.finish(c.scope.client_gone() ? 0 : c.outcome.status, c.outcome.stage);
  // Counted against the key's tokens per minute when the admission ends.
  admission.add_tokens(c.outcome.tokens_used);
  co_return keep;
}

net::awaitable<std::optional<bool>> refuse_without_client_key(ClientRequest& c) {
  if (c.w.client_keys == nullptr)
    co_return std::nullopt;
  const std::string request_id = request_id_for(c.w, c.req);
  ClientAdmission admission;
  std::optional<GatewayError> refused;
  if (co_await admit_phase(c.w, c.req, request_id, admission, refused))
    co_return std::nullopt;
  co_return co_await finish(c, request_id, *refused);
}

namespace {

// A forwarded answer is JSON (token ids, vectors, scores, a transcript):
// past this it is not one.
constexpr std::size_t kMaxForwardedAnswer = 64u << 20;

// What a forwarded request's body must be: the refusal, or nullopt; the
// body's `model` (a JSON body's, when it names one) into `model`.
std::optional<GatewayError> check_forwarded_body(const http::request<http::string_body>& req,
                                                 ForwardBody kind, std::string& model) {
  if (kind == ForwardBody::none)
    return std::nullopt;
  const auto ct = first_field(req, http::field::content_type);
  if (kind == ForwardBody::multipart) {
    // The engine reads the form; the gateway only checks it is one.
    const std::string_view type = ct ? http_tokens::trim_ows(ct->substr(0, ct->find(';'))) : "";
    if (!beast::iequals(type, "multipart/form-data"))
      return client_error(ErrorKind::unsupported_media_type,
                          "Unsupported Media Type: Content-Type must be multipart/form-data");
    return std::nullopt;
  }
  if (!ct || !is_json_content_type(*ct))
    return client_error(ErrorKind::unsupported_media_type,
                        "Unsupported Media Type: Content-Type must be application/json");
  const std::string_view body = req.body();
  auto index = index_json_object(body);
  if (!index)
    return client_error(ErrorKind::bad_request, "request body is not valid JSON: " + index.error());
  if (const auto raw = raw_member(body, *index, "model"); raw && *raw != "null") {
    auto name = raw->front() == '"' ? decode_json_string(*raw) : std::nullopt;
    if (!name)
      return client_error(ErrorKind::bad_request, "'model' must be a string");
    model = std::move(*name);
  }
  return std::nullopt;
}

}  // namespace

net::awaitable<bool> serve_forwarded(ClientRequest& c, std::string_view engine_path,
                                     ForwardBody kind) {
  WorkerContext& w = c.w;
  const http::request<http::string_body>& req = c.req;
  RequestOutcome& outcome = c.outcome;
  const std::string request_id = request_id_for(w, req);
  RequestTrace trace(w.trace_ids, w.spans, w.cfg.trace_sample_ratio, req);
  if (trace.recording())
    name_server_span(trace, req, request_id);
  auto end_with = [&](const GatewayError& e) -> net::awaitable<bool> {
    const bool keep = co_await finish(c, request_id, e);
    trace.finish(outcome.status, outcome.stage);
    co_return keep;
  };
  // Held until the answer is written: the key's concurrency slot. No
  // tokens reserved: the answer says how many the engine read.
  ClientAdmission admission;
  std::optional<GatewayError> refused;
  if (!co_await admit_phase(w, req, request_id, admission, refused))
    co_return co_await end_with(*refused);
  PickContext ctx;
  ctx.stage = Stage::decode;
  ctx.request_id = request_id;
  std::string model;
  if (auto bad = check_forwarded_body(req, kind, model))
    co_return co_await end_with(*bad);
  ctx.model = model;
  if (RequestRecord* r = outcome.record.get()) {
    r->request_id = request_id;
    r->model = model;
  }
  const auto set = w.registry.snapshot();
  const ForwardedHeaders fwd = forwarded_headers(w, req, c.client, trace);
  const std::string content_type(first_field(req, http::field::content_type).value_or(""));
  Failover failover(w);
  std::vector<const Instance*> tried;
  for (;;) {
    InstancePtr inst = w.picker.pick(untried(set->decode, tried), ctx);
    if (!inst)
      co_return co_await end_with(no_instance(Stage::decode, w.picker));
    if (RequestRecord* r = outcome.record.get()) {
      r->decode = inst;
      r->retries = failover.retries();
    }
    StageReport report(w.picker, inst, ctx);
    StageSpan span = trace.stage("forward", inst->spec.url, static_cast<unsigned>(tried.size()));
    // The body goes as it came, its own Content-Type with it (a form's
    // boundary included).
    std::string head = upstream_head(req.method(), *inst, engine_path, req.body().size(),
                                     request_id, fwd, span.traceparent(), content_type);
    const std::vector<net::const_buffer> buffers{net::buffer(req.body())};
    auto [err, ex] = co_await UpstreamExchange::start(w.pools.for_instance(inst), head, buffers,
                                                      c.scope, w.timeouts());
    std::optional<GatewayError> failed;
    std::string answer;
    if (err) {
      failed = upstream_failure(Stage::decode, err);
    } else {
      report.header(ex->status());
      span.status(ex->status());
      if (UpstreamError rerr = co_await ex->read_all(answer, kMaxForwardedAnswer); rerr)
        failed = upstream_failure(Stage::decode, rerr);
    }
    if (failed) {
      blame(w, *inst, *failed);
      trace_error(span, *failed);
      tried.push_back(inst.get());
      if (failed->kind == ErrorKind::client_gone || !has_alternative(set->decode, tried) ||
          !failover.may_retry(Stage::decode, *failed))
        co_return co_await end_with(*failed);
      spdlog::info("request {}: {} on {} failed ({}), retrying on another instance", request_id,
                   engine_path, inst->spec.url, to_string(failed->kind));
      continue;
    }
    // Whatever status the engine answered with is its answer, relayed as
    // it wrote it (vLLM's errors are OpenAI error JSON): a bad body's 400,
    // an unknown model's 404, and a 508 that a looping gateway answered,
    // which the admin API's check of a new instance must see.
    report.first_token();
    if (ex->status() < 400)
      report.succeeded();
    ex->finish();
    trace_usage(span, answer);
    span.end();
    const unsigned status = ex->status();
    outcome.status = status;
    outcome.stage = "decode";
    if (const auto usage = last_usage(answer)) {
      outcome.tokens_used = usage->prompt_tokens + usage->completion_tokens;
      admission.add_tokens(outcome.tokens_used);
      if (RequestRecord* r = outcome.record.get())
        r->usage = usage;
    }
    outcome.count_sent(answer.size());
    const bool keep =
        co_await write_whole_answer(c.client, req, *ex, std::move(answer), request_id);
    trace.finish(c.scope.client_gone() ? 0 : status, "decode");
    co_return keep;
  }
}

}  // namespace pdgate
