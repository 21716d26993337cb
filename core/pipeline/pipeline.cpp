#include "core/pipeline/pipeline.hpp"

#include <spdlog/spdlog.h>
#include <boost/beast/core/string.hpp>

#include "core/net/http_head.hpp"
#include "core/net/http_tokens.hpp"
#include "core/pipeline/admit_phase.hpp"
#include "core/pipeline/decode_phase.hpp"
#include "core/pipeline/encode_phase.hpp"
#include "core/pipeline/prefill_phase.hpp"
#include "core/pipeline/relay.hpp"
#include "core/pipeline/request_context.hpp"
#include "core/pipeline/request_hook_phase.hpp"
#include "core/pipeline/tokenize_phase.hpp"
#include "core/routing/conversation.hpp"

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

// PickContext::for_each_header over the client's request: every header but
// the credentials, names lower-cased.
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

// Phase 1: the request is one pdgate can route. Reads what the later
// phases and the policies need.
std::optional<GatewayError> validate(RequestContext& rc) {
  const auto ct = first_field(rc.req, http::field::content_type);
  if (!ct || !is_json_content_type(*ct)) {
    return client_error(ErrorKind::unsupported_media_type,
                        "Unsupported Media Type: Content-Type must be application/json");
  }
  rc.body = rc.req.body();
  auto index = index_json_object(rc.body);
  if (!index)
    return client_error(ErrorKind::bad_request, "request body is not valid JSON: " + index.error());
  rc.index = std::move(*index);
  auto facts = read_facts(rc.body, rc.index, rc.is_chat);
  if (!facts)
    return client_error(ErrorKind::bad_request, facts.error());
  rc.facts = std::move(*facts);

  rc.fwd = forwarded_headers(rc.w, rc.req, rc.client, rc.trace);
  rc.set = rc.w.registry.snapshot();
  PickContext& ctx = rc.pick();
  rc.view->model = rc.facts.model;
  ctx.model = rc.view->model;
  ctx.stream = rc.facts.stream;
  ctx.is_chat = rc.is_chat;
  ctx.prompt_raw = raw_member(rc.body, rc.index, rc.is_chat ? "messages" : "prompt").value_or("");
  // The body's conversation_id, else the X-Conversation-Id header.
  ctx.conversation_id = conversation_key(rc.req, rc.facts);
  // Policies may route on any request header but the credentials, listed
  // only if a policy reads them (policy_headers).
  ctx.header_source = &rc.req;
  ctx.for_each_header = &policy_headers;
  ctx.request_id = rc.request_id();
  return std::nullopt;
}

// What routing decided, for the access log.
// (A routed request's view has moved to the relay: its id is passed.)
void note_routing(RequestContext& rc, const std::string& request_id) {
  RequestRecord* r = rc.scope.record.get();
  if (r == nullptr)
    return;
  r->retries = rc.failover.retries();
  r->stream = rc.facts.stream;
  r->request_id = request_id;
  r->model = rc.facts.model;
  // From this worker's configuration: a reload may have changed them.
  const Config& c = rc.w.cfg;
  auto policy = [&c](const std::string& stage) { return stage.empty() ? c.policy : stage; };
  r->policies = {policy(c.policy_encode), policy(c.policy_prefill), policy(c.policy_decode)};
}

// Validate, the request hook, tokenize (--tokenizer vllm), encode, prefill,
// decode up to its first bytes: the routing
// phases, in their own frame, gone before the relay starts.
net::awaitable<Routed> route(RequestContext& rc) {
  if (auto e = validate(rc))
    co_return Routed{nullptr, std::move(*e)};
  if (auto e = request_hook_phase(rc))
    co_return Routed{nullptr, std::move(*e)};
  if (rc.w.cfg.tokenizer == "vllm")
    co_await tokenize_phase(rc);
  // (A phase with nothing to do is not entered: each coroutine call costs
  // a frame allocation.)
  if (rc.is_chat && !rc.set->encode.empty()) {
    if (auto e = co_await encode_phase(rc))
      co_return Routed{nullptr, std::move(*e)};
  }
  if (rc.one_hop) {
    rc.stage_id = rc.request_id();
    rc.decode_body = rc.connector.decode_body(rc.body, rc.index, std::nullopt);
  } else if (auto e = co_await prefill_phase(rc)) {
    co_return Routed{nullptr, std::move(*e)};
  }
  co_return co_await decode_phase(rc);
}

}  // namespace

net::awaitable<bool> finish(WorkerContext& w, MaybeTlsStream& client,
                            const http::request<http::string_body>& req,
                            const std::string& request_id, RequestScope& scope,
                            const GatewayError& err) {
  scope.stage = err.stage;
  const unsigned status = status_of(err);
  const std::string& logged = err.detail.empty() ? err.message : err.detail;
  if (err.kind == ErrorKind::client_gone || scope.client_gone()) {
    // 499 (as nginx logs it): nobody to answer.
    scope.status = 0;
    spdlog::debug("request {}: the client left during {}", request_id, err.stage);
    co_return false;
  }
  scope.status = status;
  if (status >= 500) {
    spdlog::warn("request {} -> {} ({}, {}): {}", request_id, status, to_string(err.kind),
                 to_string(err.source), logged);
  } else {
    spdlog::debug("request {} -> {} ({}): {}", request_id, status, to_string(err.kind), logged);
  }
  auto res = make_error_response(err, req.version(), req.keep_alive(), w.cfg.verbose_errors);
  if (!request_id.empty())
    res.set("X-Request-Id", request_id);
  scope.count_sent(res.body().size());
  co_return co_await write_response(client, res) && req.keep_alive();
}

namespace {

// Admission, then the routing phases; a refusal or failure is answered
// here. Its own frame, so that what routing held (the request context, an
// error's strings) is gone while the answer relays, often for minutes.
// Returns no relay when the request was answered (`keep`: whether the
// connection may be reused).
net::awaitable<std::unique_ptr<DecodeRelay>> admit_and_route(
    WorkerContext& w, MaybeTlsStream& client, http::request<http::string_body>& req,
    RequestScope& scope, RequestTrace& trace, ClientAdmission& admission, bool is_chat,
    bool& keep) {
  auto rc = std::make_unique<RequestContext>(w, client, req, scope, trace, is_chat);
  rc->view->request_id = request_id_for(w, req);
  if (trace.recording())
    name_server_span(trace, req, rc->request_id());
  // (Without --api-keys there is nothing to admit, and the phase's frame
  // is not allocated.)
  if (w.client_keys != nullptr) {
    if (auto e = co_await admit_client(w, req, rc->request_id(), admission)) {
      keep = co_await finish(w, client, req, rc->request_id(), scope, *e);
      co_return nullptr;
    }
  }
  rc->client_key = admission.key();
  Routed routed = co_await route(*rc);
  note_routing(*rc, routed.relay ? routed.relay->view->request_id : rc->request_id());
  if (!routed.relay)
    keep = co_await finish(w, client, req, rc->request_id(), scope, *routed.error);
  co_return std::move(routed.relay);
}

}  // namespace

net::awaitable<bool> serve_completion(WorkerContext& w, MaybeTlsStream& client,
                                      http::request<http::string_body>& req, RequestScope& scope,
                                      bool is_chat) {
  // Before the relay: its decode span ends before the server span.
  RequestTrace trace(w.trace_ids, w.spans, w.cfg.trace_sample_ratio, req);
  // Held until the answer is written: the key's concurrency slot.
  ClientAdmission admission;
  bool keep = false;
  std::unique_ptr<DecodeRelay> relay =
      co_await admit_and_route(w, client, req, scope, trace, admission, is_chat, keep);
  if (!relay) {
    trace.finish(scope.status, scope.stage);
    co_return keep;
  }
  scope.status = relay->ex->status();
  scope.stage = "decode";
  keep = co_await relay_answer(w, client, req, *relay, scope);
  trace.finish(scope.client_gone() ? 0 : scope.status, scope.stage);
  // Counted against the key's tokens per minute when the admission ends.
  admission.add_tokens(scope.tokens_used);
  co_return keep;
}

net::awaitable<bool> serve_models(WorkerContext& w, MaybeTlsStream& client,
                                  http::request<http::string_body>& req, RequestScope& scope) {
  const std::string request_id = request_id_for(w, req);
  RequestTrace trace(w.trace_ids, w.spans, w.cfg.trace_sample_ratio, req);
  if (trace.recording())
    name_server_span(trace, req, request_id);
  ClientAdmission admission;
  if (auto e = co_await admit_client(w, req, request_id, admission)) {
    const bool keep = co_await finish(w, client, req, request_id, scope, *e);
    trace.finish(scope.status, scope.stage);
    co_return keep;
  }
  const auto set = w.registry.snapshot();
  PickContext ctx;
  ctx.stage = Stage::decode;
  InstancePtr decode = w.picker.pick(set->decode, ctx);
  if (!decode) {
    const bool keep =
        co_await finish(w, client, req, request_id, scope, no_instance(Stage::decode));
    trace.finish(scope.status, scope.stage);
    co_return keep;
  }
  StageSpan span = trace.stage("models", decode->spec.url, 0);
  auto up = upstream_request(http::verb::get, *decode, "/v1/models", {}, request_id,
                             forwarded_headers(w, req, client, trace), span.traceparent());
  auto [err, ex] =
      co_await UpstreamExchange::start(w.pools.for_instance(decode), up, scope, w.timeouts());
  std::string answer;
  UpstreamError rerr = err;
  if (!err) {
    span.status(ex->status());
    rerr = co_await ex->read_all(answer, kMaxErrorBody);
  }
  if (rerr) {
    const GatewayError e = upstream_failure(Stage::decode, rerr);
    span.error(to_string(e.kind), e.message);
    span.end();
    const bool keep = co_await finish(w, client, req, request_id, scope, e);
    trace.finish(scope.status, scope.stage);
    co_return keep;
  }
  span.end();
  ex->finish();
  const unsigned status = ex->status();
  const bool keep = co_await write_whole_answer(client, req, *ex, std::move(answer), request_id);
  trace.finish(scope.client_gone() ? 0 : status, "decode");
  co_return keep;
}

}  // namespace pdgate
