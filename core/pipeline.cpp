#include "core/pipeline.hpp"

#include <array>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/uuid/uuid_io.hpp>

#include "core/body_rewrite.hpp"
#include "core/conversation.hpp"
#include "core/encode_stage.hpp"
#include "core/errors.hpp"
#include "core/http_head.hpp"
#include "core/json_body.hpp"
#include "core/sse.hpp"
#include "core/stage.hpp"
#include "plugins/kv_connector.hpp"

namespace pdgate {

namespace {

constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

// A prefill answer is one token of JSON plus the transfer params; anything
// near this size is not a prefill answer.
constexpr std::size_t kMaxPrefillResponse = 16u << 20;
// Engines' error bodies are short messages.
constexpr std::size_t kMaxErrorBody = 1u << 20;
constexpr std::size_t kMaxRequestIdLength = 256;

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

// "application/json", optionally with parameters ("; charset=utf-8").
bool is_json_content_type(std::string_view ct) {
  return iequals(trim(ct.substr(0, ct.find(';'))), "application/json");
}

// The client's X-Request-Id when it is a sane token, else a new UUID.
// Engines key requests by it, so it must be unique and printable.
std::string request_id_for(WorkerContext& w, const http::request<http::string_body>& req) {
  auto it = req.find("x-request-id");
  if (it != req.end()) {
    std::string_view v = it->value();
    bool ok = !v.empty() && v.size() <= kMaxRequestIdLength;
    for (char c : v)
      ok = ok && c > 0x20 && c < 0x7f;
    if (ok)
      return std::string(v);
  }
  return boost::uuids::to_string(w.uuids());
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

std::string authorization_for(const WorkerContext& w, const http::request<http::string_body>& req) {
  auto it = req.find(http::field::authorization);
  if (it != req.end())
    return std::string(it->value());
  return w.default_authorization;
}

net::awaitable<bool> send_error(beast::tcp_stream& client,
                                const http::request<http::string_body>& req,
                                const GatewayError& err, const std::string& request_id,
                                RequestScope* scope = nullptr) {
  if (scope != nullptr)
    scope->status = err.status;
  auto res = make_error_response(err, req.version(), req.keep_alive());
  if (!request_id.empty())
    res.set("X-Request-Id", request_id);
  if (err.status >= 500) {
    spdlog::warn("request {} -> {}: {}", request_id, err.status, err.message);
  } else {
    spdlog::debug("request {} -> {}: {}", request_id, err.status, err.message);
  }
  co_return co_await write_response(client, res) && req.keep_alive();
}

void copy_answer_headers(const http::response_header<>& from, http::response_header<>& to) {
  // Only what describes the body travels: hop-by-hop and framing headers
  // belong to the upstream connection, not to the client's.
  for (auto field : {http::field::content_type, http::field::cache_control}) {
    auto it = from.find(field);
    if (it != from.end())
      to.set(field, it->value());
  }
}

// Writes one piece of the relayed stream as an HTTP chunk.
net::awaitable<bool> write_chunk(beast::tcp_stream& client, std::string_view data,
                                 const Config& cfg) {
  client.expires_after(cfg.client_idle_timeout);
  auto [ec, n] = co_await net::async_write(client, http::make_chunk(net::buffer(data)), use_tuple);
  co_return !ec;
}

// Relays decode's event stream: every complete SSE event is written to the
// client as soon as it has arrived, never held for more. If decode breaks
// off mid-stream, the client gets an in-band error event and the stream
// ends: never an invented finish_reason or [DONE].
// The stream's response header. Its own coroutine, so that the header and
// its serializer are gone while the stream relays (and idles).
net::awaitable<bool> write_stream_header(WorkerContext& w, beast::tcp_stream& client,
                                         const http::request<http::string_body>& req,
                                         UpstreamExchange& ex, const std::string& request_id) {
  http::response<http::empty_body> res{static_cast<http::status>(ex.status()), req.version()};
  res.set(http::field::server, "pdgate");
  copy_answer_headers(ex.header(), res);
  if (res.find(http::field::content_type) == res.end()) {
    res.set(http::field::content_type, "text/event-stream");
  }
  res.set("X-Request-Id", request_id);
  res.chunked(true);
  res.keep_alive(req.keep_alive());
  http::response_serializer<http::empty_body> sr{res};
  client.expires_after(w.cfg.client_idle_timeout);
  auto [ec, n] = co_await http::async_write_header(client, sr, use_tuple);
  co_return !ec;
}

net::awaitable<bool> relay_stream(WorkerContext& w, beast::tcp_stream& client,
                                  const http::request<http::string_body>& req, UpstreamExchange& ex,
                                  const Instance& decode, const std::string& request_id,
                                  RequestScope& scope, OptionalTurn& conversation) {
  if (!co_await write_stream_header(w, client, req, ex, request_id)) {
    scope.on_client_gone();
    co_return false;
  }
  // The engine's header fields are no longer needed (status and framing
  // are kept by the parser).
  ex.drop_header_fields();

  SseScanner scanner;
  SseEvent event;
  DecodeOutputFilter filter(decode.spec.host, w.cfg.expose_kv_params,
                            conversation ? &conversation->recorder : nullptr);
  std::string in;
  std::string out;
  std::string failure;
  while (!ex.done()) {
    in.clear();
    ex.release_idle_memory();  // before each wait, the first included
    if (auto err = co_await ex.read_some(in); err) {
      if (err.kind == UpstreamFailure::aborted)
        co_return false;
      failure = err.detail;
      break;
    }
    if (!scanner.feed(in)) {
      failure = "decode stream from " + decode.spec.url + " is malformed: " + scanner.error();
      break;
    }
    out.clear();
    while (scanner.next(event))
      out += filter.on_event(event);
    // Stored before the client sees the end of the turn, so a client that
    // sends its next turn at once (to any replica) finds them.
    if (filter.take_new_capture() && conversation && w.conversations) {
      co_await remember_turn(*w.conversations, *conversation, *filter.captured(),
                             w.cfg.conversation_ttl, request_id);
    }
    if (!out.empty() && !co_await write_chunk(client, out, w.cfg)) {
      scope.on_client_gone();
      co_return false;
    }
    // Between events a stream may idle for minutes: it holds no event
    // buffers meanwhile (a few small allocations per event instead).
    std::string().swap(in);
    std::string().swap(out);
    // swap, not assignment: a moved-in short string keeps the old buffer.
    std::string().swap(event.raw);
    std::string().swap(event.data);
    scanner.release_idle_memory();
  }
  if (!failure.empty()) {
    spdlog::warn("request {}: decode stream broke off: {}", request_id, failure);
    decode.failures_total.fetch_add(1, std::memory_order_relaxed);
    const std::string ev =
        sse_data_event(error_json(502, "decode stage failed mid-stream: " + failure));
    if (!co_await write_chunk(client, ev, w.cfg))
      co_return false;
  } else {
    ex.finish();
  }
  client.expires_after(w.cfg.client_idle_timeout);
  auto [ec, n] = co_await net::async_write(client, http::make_chunk_last(), use_tuple);
  co_return !ec && req.keep_alive();
}

// Relays a non-streaming answer: status, the headers that describe the
// body, the body.
net::awaitable<bool> relay_whole(WorkerContext& w, beast::tcp_stream& client,
                                 const http::request<http::string_body>& req, UpstreamExchange& ex,
                                 const Instance& inst, Stage stage, const std::string& request_id,
                                 DecodeOutputFilter* filter = nullptr,
                                 const OptionalTurn& conversation = std::nullopt) {
  std::string body;
  if (auto err = co_await ex.read_all(body, std::max<std::size_t>(w.cfg.max_body_bytes, 64u << 20));
      err) {
    if (err.kind == UpstreamFailure::aborted)
      co_return false;
    inst.failures_total.fetch_add(1, std::memory_order_relaxed);
    co_return co_await send_error(client, req, stage_failure(stage, err), request_id);
  }
  ex.finish();
  if (filter != nullptr) {
    filter->on_body(body);
    if (filter->take_new_capture() && conversation && w.conversations) {
      co_await remember_turn(*w.conversations, *conversation, *filter->captured(),
                             w.cfg.conversation_ttl, request_id);
    }
  }
  http::response<http::string_body> res{static_cast<http::status>(ex.status()), req.version()};
  res.set(http::field::server, "pdgate");
  copy_answer_headers(ex.header(), res);
  res.set("X-Request-Id", request_id);
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  co_return co_await write_response(client, res) && req.keep_alive();
}

struct PrefillResult {
  std::optional<GatewayError> error;
  // The failure was the engine's (connect error, timeout, 5xx) and came
  // before any byte reached the client: another instance may succeed.
  bool retriable = false;
  std::optional<std::string> kv_params;  // raw JSON of kv_transfer_params, if not null
  InstancePtr instance;
  std::string request_id;  // the X-Request-Id both stages carry

  // What the decode body carries: the params, or nothing when null.
  std::optional<std::string_view> kv_params_view() const {
    if (kv_params)
      return std::string_view(*kv_params);
    return std::nullopt;
  }
};

// p2p-nccl names each peer by its ZMQ address, which only the instance's
// configuration can give.
GatewayError missing_kv_peer(const Instance& inst) {
  return upstream_error(503, "--kv-connector p2p-nccl: no ZMQ address configured for " +
                                 inst.spec.url + " (give it as " + inst.spec.url +
                                 "@zmqhost:zmqport)");
}

// 32 hex digits of a fresh UUID (p2p-nccl request ids).
std::string uuid_hex(WorkerContext& w) {
  std::string s = boost::uuids::to_string(w.uuids());
  s.erase(std::remove(s.begin(), s.end(), '-'), s.end());
  return s;
}

// `list` without `skip` (the instance that just failed).
std::vector<InstancePtr> without(const std::vector<InstancePtr>& list, const Instance* skip) {
  std::vector<InstancePtr> out;
  out.reserve(list.size());
  for (const auto& i : list) {
    if (i.get() != skip)
      out.push_back(i);
  }
  return out;
}

// Whether `list` has a healthy instance other than `skip`: retrying is
// pointless (and would turn a 502 into a 503) when there is none.
bool has_alternative(const std::vector<InstancePtr>& list, const Instance* skip) {
  for (const auto& i : list) {
    if (i.get() != skip && i->healthy.load(std::memory_order_relaxed))
      return true;
  }
  return false;
}

// An engine-side failure: counts towards passive ejection.
void note_failure(WorkerContext& w, const Instance& inst, const std::string& why) {
  inst.failures_total.fetch_add(1, std::memory_order_relaxed);
  if (inst.note_request_failure(w.cfg.eject_after, why) && w.metrics) {
    w.metrics->ejections.fetch_add(1, std::memory_order_relaxed);
  }
}

bool retriable(const UpstreamError& e) {
  return e.kind != UpstreamFailure::aborted && e.kind != UpstreamFailure::too_large;
}

// Holds one unit of the retry budget for as long as the retry runs.
class RetryToken {
 public:
  RetryToken() = default;
  RetryToken(const RetryToken&) = delete;
  RetryToken& operator=(const RetryToken&) = delete;
  ~RetryToken() {
    if (m_)
      m_->retries_in_flight.fetch_sub(1, std::memory_order_relaxed);
  }
  // Retries in flight stay under budget x requests in flight (at least
  // one), so an outage cannot multiply the load on what is left.
  bool take(WorkerContext& w) {
    if (taken_)
      return false;
    if (w.metrics == nullptr)
      return taken_ = true;
    const auto active = w.active_requests.load(std::memory_order_relaxed);
    const auto limit = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(w.cfg.retry_budget * static_cast<double>(active)));
    if (w.metrics->retries_in_flight.fetch_add(1) + 1 > limit) {
      w.metrics->retries_in_flight.fetch_sub(1);
      w.metrics->retries_refused.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    m_ = w.metrics;
    return taken_ = true;
  }
  // The retry is over: its unit goes back to the budget (the request still
  // may not retry again).
  void release() {
    if (m_)
      m_->retries_in_flight.fetch_sub(1, std::memory_order_relaxed);
    m_ = nullptr;
  }

 private:
  GatewayMetrics* m_ = nullptr;
  bool taken_ = false;
};

// Stage 1: the prefill computes the prompt's KV cache (max_tokens 1). With
// NIXL it answers with the kv_transfer_params that let a decode pull it;
// the other connectors move the cache out of band and the answer is
// dropped. `decode` is the decode already chosen, when the connector names
// both peers in the request id.
net::awaitable<PrefillResult> run_prefill(
    WorkerContext& w, const InstanceSet& set, const http::request<http::string_body>& req,
    std::string_view client_body, const JsonObjectIndex& index, std::string_view prefill_params,
    const Instance* decode, const PickContext& base, const std::string& request_id,
    const std::string& authorization, RequestScope& scope, const Instance* skip = nullptr) {
  const KvConnector& connector = *w.connector;
  PrefillResult r;
  PickContext ctx = base;
  ctx.stage = Stage::prefill;
  const auto started = std::chrono::steady_clock::now();
  const auto candidates = without(set.prefill, skip);
  r.instance = w.picker.pick(candidates, ctx);
  spdlog::debug("request {}: prefill on {} ({} candidate(s))", request_id,
                r.instance ? r.instance->spec.url : std::string("none"), candidates.size());
  if (!r.instance) {
    r.error = no_instance(Stage::prefill);
    co_return r;
  }
  if (connector.names_peers() && r.instance->spec.kv_peer.empty()) {
    r.error = missing_kv_peer(*r.instance);
    co_return r;
  }
  InFlightGuard guard(r.instance);
  StageReport report(w.picker, r.instance, ctx);
  const UpstreamSpec* decode_spec = decode != nullptr ? &decode->spec : nullptr;
  r.request_id =
      connector.stage_request_id(request_id, &r.instance->spec, decode_spec, uuid_hex(w));
  // Slices of the client's body plus the few edited bytes: the prompt is
  // written from where it was received, never copied.
  const SplicedText body = connector.prefill_body(client_body, index, prefill_params);
  const auto head = upstream_head(http::verb::post, *r.instance, req.target(), body.size(),
                                  r.request_id, authorization);
  const auto buffers = body_buffers(body);
  auto& pool = w.pools.for_instance(r.instance);
  auto [err, ex] = co_await UpstreamExchange::start(pool, head, buffers, scope, w.timeouts());
  if (ex)
    report.first_byte(ex->status());
  if (err) {
    if (retriable(err)) {
      note_failure(w, *r.instance, err.detail);
      r.retriable = true;
    }
    r.error = stage_failure(Stage::prefill, err);
    co_return r;
  }
  if (ex->status() < 200 || ex->status() >= 300) {
    // A 4xx is the request's fault: never held against the engine.
    if (ex->status() >= 500) {
      note_failure(w, *r.instance, "answered " + std::to_string(ex->status()));
      r.retriable = true;
    }
    r.error = co_await engine_status_error(Stage::prefill, *ex, *r.instance);
    co_return r;
  }
  std::string answer;
  if (auto rerr = co_await ex->read_all(answer, kMaxPrefillResponse); rerr) {
    if (retriable(rerr)) {
      note_failure(w, *r.instance, rerr.detail);
      r.retriable = true;
    }
    r.error = stage_failure(Stage::prefill, rerr);
    co_return r;
  }
  ex->finish();
  r.instance->note_request_success();
  if (w.metrics) {
    w.metrics->prefill_seconds.observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  if (!connector.passes_params()) {
    report.succeeded();
    co_return r;
  }
  auto params = extract_kv_params(answer);
  if (!params) {
    r.error = upstream_error(502, "prefill stage failed: " + r.instance->spec.url +
                                      " answered with invalid JSON: " + params.error());
    co_return r;
  }
  r.kv_params = std::move(*params);
  report.succeeded();
  if (!r.kv_params) {
    // The one token was EOS, or the engine aborted: decode prefills locally.
    spdlog::debug("request {}: prefill returned no kv_transfer_params", request_id);
  }
  co_return r;
}

}  // namespace

http::request_header<> upstream_head(http::verb method, const Instance& inst,
                                     std::string_view target, std::size_t body_size,
                                     const std::string& request_id,
                                     const std::string& authorization) {
  http::request_header<> h;
  h.method(method);
  h.target(target);
  h.version(11);
  h.set(http::field::host, inst.spec.host + ":" + std::to_string(inst.spec.port));
  h.set(http::field::user_agent, "pdgate");
  h.set("X-Request-Id", request_id);
  if (!authorization.empty())
    h.set(http::field::authorization, authorization);
  if (method == http::verb::post) {
    h.set(http::field::content_type, "application/json");
    h.set(http::field::content_length, std::to_string(body_size));
  }
  return h;
}

http::request<http::string_body> upstream_request(http::verb method, const Instance& inst,
                                                  std::string_view target, std::string body,
                                                  const std::string& request_id,
                                                  const std::string& authorization) {
  http::request<http::string_body> r{
      upstream_head(method, inst, target, body.size(), request_id, authorization)};
  r.keep_alive(true);
  r.body() = std::move(body);
  r.prepare_payload();
  return r;
}

std::vector<net::const_buffer> body_buffers(const SplicedText& body) {
  std::vector<net::const_buffer> out;
  out.reserve(body.piece_count());
  body.for_each([&](std::string_view piece) { out.emplace_back(piece.data(), piece.size()); });
  return out;
}

std::string snippet(std::string_view s, std::size_t max) {
  std::string out(s.substr(0, max));
  if (s.size() > max)
    out += "...";
  return out;
}

GatewayError stage_failure(Stage stage, const UpstreamError& e) {
  return upstream_error(502, std::string(to_string(stage)) + " stage failed: " + e.detail);
}

GatewayError no_instance(Stage stage) {
  return upstream_error(503,
                        std::string("no healthy ") + to_string(stage) + " instance is available");
}

// An engine answered with an error status. Its own 4xx goes to the client
// verbatim (the request is at fault: prompt too long, unknown model); a
// 5xx means the engine is at fault and becomes a 502 naming the stage.
net::awaitable<GatewayError> engine_status_error(Stage stage, UpstreamExchange& ex,
                                                 const Instance& inst) {
  std::string body;
  auto err = co_await ex.read_all(body, kMaxErrorBody);
  const unsigned status = ex.status();
  if (status >= 400 && status < 500) {
    GatewayError g =
        upstream_error(status, std::string(to_string(stage)) + " stage: " + inst.spec.url +
                                   " answered " + std::to_string(status));
    if (!err && !body.empty()) {
      g.passthrough_body = std::move(body);
      auto ct = ex.header().find(http::field::content_type);
      if (ct != ex.header().end())
        g.passthrough_content_type = std::string(ct->value());
    }
    co_return g;
  }
  co_return upstream_error(502, std::string(to_string(stage)) + " stage failed: " + inst.spec.url +
                                    " answered " + std::to_string(status) + ": " + snippet(body));
}

net::awaitable<bool> write_response(beast::tcp_stream& client,
                                    http::response<http::string_body>& res) {
  // A client that stops reading must not pin the connection forever.
  client.expires_after(std::chrono::seconds(60));
  if (!head_renders_message(res)) {
    auto [ec, n] = co_await http::async_write(client, res, use_tuple);
    co_return !ec;
  }
  const std::string head = render_head(res.base());
  const std::array<net::const_buffer, 2> parts{net::buffer(head), net::buffer(res.body())};
  auto [ec, n] = co_await net::async_write(client, parts, use_tuple);
  co_return !ec;
}

namespace {

// The request as the routing policy sees it (PickContext and the strings
// its views point to). On the heap so that it can outlive the routing
// coroutine: the decode stage's StageReport hands it to the policy's
// on_complete when the relay ends.
struct RequestView {
  std::string request_id;
  std::string model;
  PickContext ctx;
};

// What relaying decode's answer needs, handed from the routing coroutine
// to the relay once decode answered 2xx. Routing's frame (several KiB:
// GCC gives every local of every branch its own slot), the JSON index and
// the upstream request are freed before the relay starts: a stream can
// idle for minutes, and 10,000 of them must fit in 100 MiB.
struct DecodeRelay {
  std::unique_ptr<RequestView> view;
  std::unique_ptr<InFlightGuard> guard;
  std::unique_ptr<StageReport> report;  // refers to view->ctx
  std::unique_ptr<UpstreamExchange> ex;
  InstancePtr decode;
  OptionalTurn conversation;
  bool stream = false;
};

// Validation, policies, encode, prefill and the start of decode (with
// failover). Returns whether the client connection may be reused, unless
// it sets `relay`: then decode answered 2xx and the caller relays it.
net::awaitable<bool> route_completion(WorkerContext& w, beast::tcp_stream& client,
                                      http::request<http::string_body>& req, RequestScope& scope,
                                      bool is_chat, std::unique_ptr<DecodeRelay>& relay) {
  auto view = std::make_unique<RequestView>();
  view->request_id = request_id_for(w, req);
  const std::string& request_id = view->request_id;
  auto ct = req.find(http::field::content_type);
  if (ct == req.end() || !is_json_content_type(ct->value())) {
    co_return co_await send_error(
        client, req,
        client_error(415, "Unsupported Media Type: Content-Type must be application/json"),
        request_id, &scope);
  }
  const std::string_view body = req.body();
  auto index = index_json_object(body);
  if (!index) {
    co_return co_await send_error(
        client, req, client_error(400, "request body is not valid JSON: " + index.error()),
        request_id, &scope);
  }
  auto facts = read_facts(body, *index, is_chat);
  if (!facts)
    co_return co_await send_error(client, req, client_error(400, facts.error()), request_id,
                                  &scope);

  const std::string authorization = authorization_for(w, req);
  const auto set = w.registry.snapshot();
  PickContext& ctx = view->ctx;
  view->model = facts->model;
  ctx.model = view->model;
  ctx.stream = facts->stream;
  ctx.is_chat = is_chat;
  ctx.prompt_raw = raw_member(body, *index, is_chat ? "messages" : "prompt").value_or("");
  // The body's conversation_id, else the X-Conversation-Id header.
  ctx.conversation_id = conversation_key(req, *facts);
  // Policies may route on any request header but the credentials, listed
  // only if a policy reads them (policy_headers).
  ctx.header_source = &req;
  ctx.for_each_header = &policy_headers;
  ctx.request_id = request_id;

  // Stage 0: images and audio go to the encoders first (E -> P -> D or
  // E -> PD); nothing reaches prefill or decode if one of them fails.
  if (is_chat) {
    auto encode_error =
        co_await run_encode_stage(w, *set, body, *index, ctx, request_id, authorization, scope);
    if (scope.client_gone())
      co_return false;
    if (encode_error)
      co_return co_await send_error(client, req, *encode_error, request_id);
  }

  RetryToken retry;  // one retry per request at most
  double prefill_seconds = 0;
  // Stage 1: prefill, unless the decode instances are combined P+D ones.
  const KvConnector& connector = *w.connector;
  const bool one_hop = w.cfg.prefill_disabled || !connector.has_prefill();
  // One hop has no prefill to hand blocks to, and only NIXL's params can
  // name a previous turn's blocks: no reuse otherwise.
  const bool reuse = !one_hop && connector.passes_params();
  OptionalTurn conversation;  // set when this turn's answer may be stored
  // Slices of `body` plus edits; small however long the prompt.
  SplicedText decode_body;
  const std::size_t read_room = facts->stream ? kStreamRead : kWholeAnswerRead;
  InstancePtr prefill;
  InstancePtr decode;
  std::string stage_id = request_id;
  if (one_hop) {
    decode_body = connector.decode_body(body, *index, std::nullopt);
  } else {
    if (connector.names_peers()) {
      // The request id names both peers, so decode is chosen first.
      ctx.stage = Stage::decode;
      decode = w.picker.pick(set->decode, ctx);
      if (!decode)
        co_return co_await send_error(client, req, no_instance(Stage::decode), request_id);
      if (decode->spec.kv_peer.empty()) {
        co_return co_await send_error(client, req, missing_kv_peer(*decode), request_id);
      }
    }
    // Multi-turn reuse: the previous turn's decode blocks, taken (once,
    // across replicas) for this prefill to read.
    std::string prefill_params(kDefaultPrefillKvParams);
    const auto prefill_started = std::chrono::steady_clock::now();
    if (w.conversations) {
      const TurnRequest turn{
          reuse ? ctx.conversation_id : std::nullopt,
          conversation_scope(req, authorization, w.cfg.conversation_scope_header), body, &*index,
          is_chat};
      prefill_params = co_await prefill_kv_params_for_turn(
          *w.conversations, w.conversation_stores->counters(), turn, conversation, request_id);
      if (scope.client_gone())
        co_return false;
    }
    PrefillResult pre = co_await run_prefill(w, *set, req, body, *index, prefill_params,
                                             decode.get(), ctx, request_id, authorization, scope);
    if (scope.client_gone())
      co_return false;
    // Failover: a prefill that failed on the engine's side is tried once
    // more on another prefill instance, within the retry budget.
    if (pre.error && pre.retriable && has_alternative(set->prefill, pre.instance.get()) &&
        retry.take(w)) {
      if (w.metrics)
        w.metrics->retries_prefill.fetch_add(1, std::memory_order_relaxed);
      spdlog::info("request {}: prefill on {} failed, retrying on another instance", request_id,
                   pre.instance->spec.url);
      // A named result, not `pre = co_await ...`: assigning a co_await
      // result over a live frame object is where GCC 12 miscompiles.
      const InstancePtr failed = pre.instance;
      PrefillResult second =
          co_await run_prefill(w, *set, req, body, *index, prefill_params, decode.get(), ctx,
                               request_id, authorization, scope, failed.get());
      pre = std::move(second);
      // The retried prefill is done; the decode that follows is no retry.
      retry.release();
      if (scope.client_gone())
        co_return false;
    }
    if (pre.error) {
      scope.stage = "prefill";
      co_return co_await send_error(client, req, *pre.error, request_id, &scope);
    }
    prefill = pre.instance;
    stage_id = pre.request_id;
    decode_body = connector.decode_body(body, *index, pre.kv_params_view());
    prefill_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_started).count();
  }

  // Stage 2: decode, with the prefill's params attached. A decode that
  // fails before sending anything is retried once (budget permitting) on
  // another decode, after a fresh prefill: the first prefill's blocks were
  // meant for the failed one. Never once a byte reached the client. With
  // p2p-nccl the decode was chosen before the prefill (the request id names
  // both), so it is not retried there.
  InstancePtr failed_decode;
  for (int attempt = 0;; ++attempt) {
    ctx.stage = Stage::decode;
    ctx.chosen_prefill = prefill.get();
    if (!decode || attempt > 0) {
      const auto candidates = without(set->decode, failed_decode.get());
      decode = w.picker.pick(candidates, ctx);
    }
    if (!decode) {
      co_return co_await send_error(client, req, no_instance(Stage::decode), request_id, &scope);
    }
    const auto decode_started = std::chrono::steady_clock::now();
    if (w.metrics) {
      w.metrics->overhead_seconds.observe(
          std::chrono::duration<double>(decode_started - scope.received).count() - prefill_seconds);
    }
    auto guard = std::make_unique<InFlightGuard>(decode);
    auto report = std::make_unique<StageReport>(w.picker, decode, ctx);
    const auto head = upstream_head(http::verb::post, *decode, req.target(), decode_body.size(),
                                    stage_id, authorization);
    const auto buffers = body_buffers(decode_body);
    auto [err, ex] = co_await UpstreamExchange::start(w.pools.for_instance(decode), head, buffers,
                                                      scope, w.timeouts(), read_room);
    if (ex)
      report->first_byte(ex->status());
    std::optional<GatewayError> failure;
    if (err) {
      if (err.kind == UpstreamFailure::aborted)
        co_return false;
      note_failure(w, *decode, err.detail);
      failure = stage_failure(Stage::decode, err);
    } else if (ex->status() >= 500) {
      note_failure(w, *decode, "answered " + std::to_string(ex->status()));
      failure = co_await engine_status_error(Stage::decode, *ex, *decode);
      if (scope.client_gone())
        co_return false;
    } else if (ex->status() < 200 || ex->status() >= 300) {
      auto e = co_await engine_status_error(Stage::decode, *ex, *decode);
      if (scope.client_gone())
        co_return false;
      scope.stage = "decode";
      co_return co_await send_error(client, req, e, request_id, &scope);
    }
    if (failure) {
      if (attempt == 0 && !connector.names_peers() && !scope.client_gone() &&
          has_alternative(set->decode, decode.get()) && retry.take(w)) {
        if (w.metrics)
          w.metrics->retries_decode.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("request {}: decode on {} failed before its first byte, retrying", request_id,
                     decode->spec.url);
        failed_decode = decode;
        if (one_hop)
          continue;
        PrefillResult again =
            co_await run_prefill(w, *set, req, body, *index, kDefaultPrefillKvParams, nullptr, ctx,
                                 request_id, authorization, scope);
        if (scope.client_gone())
          co_return false;
        if (!again.error) {
          prefill = again.instance;
          stage_id = again.request_id;
          decode_body = connector.decode_body(body, *index, again.kv_params_view());
          continue;
        }
        failure = again.error;
      }
      scope.stage = "decode";
      co_return co_await send_error(client, req, *failure, request_id, &scope);
    }
    decode->note_request_success();
    // Nothing is retried once decode answered: a retry that got here is
    // over, and the stream that follows (minutes, maybe) holds no budget.
    retry.release();
    if (w.metrics) {
      w.metrics->decode_ttft_seconds.observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - decode_started).count());
    }
    // The decode stage counts as succeeded once it answered 2xx: what
    // happens while relaying is the stream's own business.
    report->succeeded();
    scope.status = ex->status();
    scope.stage = "decode";
    relay = std::make_unique<DecodeRelay>();
    relay->view = std::move(view);
    relay->guard = std::move(guard);
    relay->report = std::move(report);
    relay->ex = std::move(ex);
    relay->decode = decode;
    relay->conversation = std::move(conversation);
    relay->stream = facts->stream;
    co_return true;
  }
}

// A non-streaming decode answer, through the filter (its own frame, so the
// filter takes no room in serve_completion's while a stream relays).
net::awaitable<bool> relay_decode_whole(WorkerContext& w, beast::tcp_stream& client,
                                        const http::request<http::string_body>& req,
                                        DecodeRelay& r) {
  DecodeOutputFilter filter(r.decode->spec.host, w.cfg.expose_kv_params,
                            r.conversation ? &r.conversation->recorder : nullptr);
  co_return co_await relay_whole(w, client, req, *r.ex, *r.decode, Stage::decode,
                                 r.view->request_id, &filter, r.conversation);
}

}  // namespace

net::awaitable<bool> serve_completion(WorkerContext& w, beast::tcp_stream& client,
                                      http::request<http::string_body>& req, RequestScope& scope,
                                      bool is_chat) {
  // Routing runs in its own frame, gone before the relay starts; this
  // frame holds only the relay's state.
  std::unique_ptr<DecodeRelay> relay;
  const bool keep_alive = co_await route_completion(w, client, req, scope, is_chat, relay);
  if (!relay)
    co_return keep_alive;
  DecodeRelay& r = *relay;
  if (r.stream) {
    co_return co_await relay_stream(w, client, req, *r.ex, *r.decode, r.view->request_id, scope,
                                    r.conversation);
  }
  co_return co_await relay_decode_whole(w, client, req, r);
}

net::awaitable<bool> serve_models(WorkerContext& w, beast::tcp_stream& client,
                                  http::request<http::string_body>& req, RequestScope& scope) {
  const std::string request_id = request_id_for(w, req);
  const auto set = w.registry.snapshot();
  PickContext ctx;
  ctx.stage = Stage::decode;
  InstancePtr decode = w.picker.pick(set->decode, ctx);
  if (!decode)
    co_return co_await send_error(client, req, no_instance(Stage::decode), request_id, &scope);
  auto up = upstream_request(http::verb::get, *decode, "/v1/models", {}, request_id,
                             authorization_for(w, req));
  auto [err, ex] =
      co_await UpstreamExchange::start(w.pools.for_instance(decode), up, scope, w.timeouts());
  if (err) {
    if (err.kind == UpstreamFailure::aborted)
      co_return false;
    co_return co_await send_error(client, req, stage_failure(Stage::decode, err), request_id,
                                  &scope);
  }
  co_return co_await relay_whole(w, client, req, *ex, *decode, Stage::decode, request_id);
}

}  // namespace pdgate
