#include "core/pipeline.hpp"

#include <array>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_cat.hpp>
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
// Retries of a request that never reached an engine (its connection was
// refused or timed out), per stage, whatever the retry budget: they cost
// the engines nothing, but a request must not walk a long list of dead
// instances either.
constexpr int kNeverSentRetries = 3;

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

}  // namespace

ForwardedHeaders forwarded_headers(const WorkerContext& w,
                                   const http::request<http::string_body>& req) {
  ForwardedHeaders f;
  auto it = req.find(http::field::authorization);
  f.authorization = it != req.end() ? std::string(it->value()) : w.default_authorization;
  const auto via = req.find(http::field::via);
  const std::string_view incoming =
      via != req.end() ? std::string_view(via->value()) : std::string_view();
  if (w.loop_guard != nullptr)
    f.via = w.loop_guard->via_for_upstream(incoming);
  return f;
}

namespace {

net::awaitable<bool> send_error(WorkerContext& w, beast::tcp_stream& client,
                                const http::request<http::string_body>& req,
                                const GatewayError& err, const std::string& request_id,
                                RequestScope* scope = nullptr) {
  if (scope != nullptr)
    scope->status = err.status;
  auto res = make_error_response(err, req.version(), req.keep_alive(), w.cfg.verbose_errors);
  if (!request_id.empty())
    res.set("X-Request-Id", request_id);
  const std::string& logged = err.detail.empty() ? err.message : err.detail;
  if (err.status >= 500) {
    spdlog::warn("request {} -> {}: {}", request_id, err.status, logged);
  } else {
    spdlog::debug("request {} -> {}: {}", request_id, err.status, logged);
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

// Reads decode's event stream and turns it into the bytes the client
// gets: complete SSE events only (a read that ends mid-event keeps the
// partial event for the next), through the output filter (which captures
// and hides kv_transfer_params). The relay writes whatever one read
// completed in one write, so events that arrived together leave together
// and none is held back waiting for more.
class StreamRelay {
 public:
  StreamRelay(WorkerContext& w, UpstreamExchange& ex, const Instance& decode,
              const std::string& request_id, const std::optional<std::string>& conversation)
      : w_(w),
        ex_(ex),
        decode_(decode),
        request_id_(request_id),
        conversation_(conversation),
        filter_(decode.spec.host, w.cfg.expose_kv_params) {}

  bool done() const { return ex_.done(); }

  // One read from decode; appends the client bytes it completed to `out`
  // (possibly none).
  net::awaitable<UpstreamError> read_into(std::string& out) {
    in_.clear();
    ex_.release_idle_memory();  // before each wait, the first included
    if (auto err = co_await ex_.read_some(in_); err)
      co_return err;
    if (!scanner_.feed(in_)) {
      co_return UpstreamError{UpstreamFailure::protocol, "decode stream from " + decode_.spec.url +
                                                             " is malformed: " + scanner_.error()};
    }
    while (scanner_.next(event_))
      out += filter_.on_event(event_);
    // Stored before the client sees the end of the turn, so a client that
    // sends its next turn at once (to any replica) finds them.
    if (filter_.take_new_capture() && conversation_ && w_.conversations) {
      co_await remember_turn(*w_.conversations, *conversation_, *filter_.captured(),
                             w_.cfg.conversation_ttl, request_id_);
    }
    // Between events a stream may idle for minutes: it holds no event
    // buffers meanwhile (a few small allocations per event instead).
    // swap, not assignment: a moved-in short string keeps the old buffer.
    std::string().swap(in_);
    std::string().swap(event_.raw);
    std::string().swap(event_.data);
    scanner_.release_idle_memory();
    co_return UpstreamError{};
  }

 private:
  WorkerContext& w_;
  UpstreamExchange& ex_;
  const Instance& decode_;
  const std::string& request_id_;
  const std::optional<std::string>& conversation_;
  SseScanner scanner_;
  SseEvent event_;
  DecodeOutputFilter filter_;
  std::string in_;
};

// The stream's response header and its first events, in one write. Its
// own coroutine, so that the header is gone while the stream relays (and
// idles).
net::awaitable<bool> write_stream_start(WorkerContext& w, beast::tcp_stream& client,
                                        const http::request<http::string_body>& req,
                                        UpstreamExchange& ex, const std::string& request_id,
                                        std::string_view first) {
  http::response<http::empty_body> res{static_cast<http::status>(ex.status()), req.version()};
  res.set(http::field::server, "pdgate");
  copy_answer_headers(ex.header(), res);
  if (res.find(http::field::content_type) == res.end()) {
    res.set(http::field::content_type, "text/event-stream");
  }
  res.set("X-Request-Id", request_id);
  res.chunked(true);
  res.keep_alive(req.keep_alive());
  const std::string head = render_head(res.base());
  client.expires_after(w.cfg.client_idle_timeout);
  beast::error_code ec;
  std::size_t n = 0;
  if (first.empty()) {
    std::tie(ec, n) = co_await net::async_write(client, net::buffer(head), use_tuple);
  } else {
    std::tie(ec, n) = co_await net::async_write(
        client, beast::buffers_cat(net::buffer(head), http::make_chunk(net::buffer(first))),
        use_tuple);
  }
  co_return !ec;
}

// Relays a non-streaming answer: status, the headers that describe the
// body, the body.
net::awaitable<bool> write_whole_answer(WorkerContext& w, beast::tcp_stream& client,
                                        const http::request<http::string_body>& req,
                                        const UpstreamExchange& ex, std::string body,
                                        const std::string& request_id) {
  (void)w;
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
  // False when the request never reached the engine (it could not be
  // connected to): sending it elsewhere costs the engines nothing.
  bool reached_engine = true;
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
  GatewayError g = upstream_error(503,
                                  "--kv-connector p2p-nccl: an instance has no ZMQ address "
                                  "configured (give instances as URL@zmqhost:zmqport)");
  g.detail = "--kv-connector p2p-nccl: no ZMQ address configured for " + inst.spec.url +
             " (give it as " + inst.spec.url + "@zmqhost:zmqport)";
  return g;
}

// 32 hex digits of a fresh UUID (p2p-nccl request ids).
std::string uuid_hex(WorkerContext& w) {
  std::string s = boost::uuids::to_string(w.uuids());
  s.erase(std::remove(s.begin(), s.end(), '-'), s.end());
  return s;
}

bool tried_already(const std::vector<const Instance*>& tried, const Instance* i) {
  return std::find(tried.begin(), tried.end(), i) != tried.end();
}

// `list` without the instances already tried for this request.
std::vector<InstancePtr> untried(const std::vector<InstancePtr>& list,
                                 const std::vector<const Instance*>& tried) {
  std::vector<InstancePtr> out;
  out.reserve(list.size());
  for (const auto& i : list) {
    if (!tried_already(tried, i.get()))
      out.push_back(i);
  }
  return out;
}

// Whether `list` has a healthy instance not tried yet: retrying is
// pointless (and would turn a 502 into a 503) when there is none.
bool has_alternative(const std::vector<InstancePtr>& list,
                     const std::vector<const Instance*>& tried) {
  for (const auto& i : list) {
    if (!tried_already(tried, i.get()) && i->healthy.load(std::memory_order_relaxed))
      return true;
  }
  return false;
}

// An engine-side failure: counts towards passive ejection.
void note_failure(WorkerContext& w, const Instance& inst, const std::string& why) {
  inst.failures_total.fetch_add(1, std::memory_order_relaxed);
  if (inst.note_request_failure(w.cfg.eject_after, why)) {
    if (w.metrics)
      w.metrics->ejections.fetch_add(1, std::memory_order_relaxed);
    if (w.registry.on_ejected)
      w.registry.on_ejected(inst);
  }
}

// How an upstream failure before the client's first byte counts: a
// request that never reached the engine (connect) can go elsewhere for
// free; the gateway's own shortage (local) is nobody's engine's fault and
// not retried; an instance ejected meanwhile was already counted.
struct FailureClass {
  bool retriable = false;
  bool reached_engine = true;
  bool engine_fault = false;
};

FailureClass classify_failure(const UpstreamError& e) {
  switch (e.kind) {
    case UpstreamFailure::connect:
    case UpstreamFailure::connect_timeout:
      return {true, false, true};
    case UpstreamFailure::timeout:
    case UpstreamFailure::closed:
    case UpstreamFailure::protocol:
      return {true, true, true};
    case UpstreamFailure::ejected:
      return {true, true, false};
    case UpstreamFailure::local:
    case UpstreamFailure::aborted:
    case UpstreamFailure::too_large:
    case UpstreamFailure::none:
      break;
  }
  return {};
}

// The answer to a failure the gateway itself caused (no descriptor or
// memory to reach an engine): 503, the client may retry.
GatewayError local_failure(Stage stage, const UpstreamError& e) {
  GatewayError g = upstream_error(
      503, std::string(to_string(stage)) + " stage: the gateway is out of resources: " + e.detail);
  g.source = ErrorSource::internal;
  return g;
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
    const ForwardedHeaders& fwd, RequestScope& scope, const std::vector<const Instance*>& tried) {
  const KvConnector& connector = *w.connector;
  PrefillResult r;
  PickContext ctx = base;
  ctx.stage = Stage::prefill;
  const auto started = std::chrono::steady_clock::now();
  const auto candidates = untried(set.prefill, tried);
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
  const auto head =
      upstream_head(http::verb::post, *r.instance, req.target(), body.size(), r.request_id, fwd);
  const auto buffers = body_buffers(body);
  auto& pool = w.pools.for_instance(r.instance);
  auto [err, ex] = co_await UpstreamExchange::start(pool, head, buffers, scope, w.timeouts());
  if (ex)
    report.first_byte(ex->status());
  // A failure on the way: counted against the engine when it is the
  // engine's, retriable elsewhere when another prefill may succeed.
  auto failed = [&](const UpstreamError& e) {
    const auto c = classify_failure(e);
    if (c.engine_fault)
      note_failure(w, *r.instance, e.detail);
    r.retriable = c.retriable;
    r.reached_engine = c.reached_engine;
    r.error = e.kind == UpstreamFailure::local ? local_failure(Stage::prefill, e)
                                               : stage_failure(Stage::prefill, e);
  };
  if (err) {
    failed(err);
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
    failed(rerr);
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
    r.error = upstream_error(502, "prefill stage failed: the engine answered with invalid JSON");
    r.error->detail = "prefill stage failed: " + r.instance->spec.url +
                      " answered with invalid JSON: " + params.error();
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
                                     const std::string& request_id, const ForwardedHeaders& fwd) {
  http::request_header<> h;
  h.method(method);
  h.target(target);
  h.version(11);
  h.set(http::field::host, inst.spec.host + ":" + std::to_string(inst.spec.port));
  h.set(http::field::user_agent, "pdgate");
  h.set("X-Request-Id", request_id);
  if (!fwd.authorization.empty())
    h.set(http::field::authorization, fwd.authorization);
  if (!fwd.via.empty())
    h.set(http::field::via, fwd.via);
  if (method == http::verb::post) {
    h.set(http::field::content_type, "application/json");
    h.set(http::field::content_length, std::to_string(body_size));
  }
  return h;
}

http::request<http::string_body> upstream_request(http::verb method, const Instance& inst,
                                                  std::string_view target, std::string body,
                                                  const std::string& request_id,
                                                  const ForwardedHeaders& fwd) {
  http::request<http::string_body> r{
      upstream_head(method, inst, target, body.size(), request_id, fwd)};
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

const char* public_reason(UpstreamFailure kind) {
  switch (kind) {
    case UpstreamFailure::connect:
      return "cannot connect to the engine";
    case UpstreamFailure::connect_timeout:
      return "timed out connecting to the engine";
    case UpstreamFailure::timeout:
      return "timed out waiting for the engine";
    case UpstreamFailure::closed:
      return "the engine closed the connection";
    case UpstreamFailure::protocol:
      return "the engine's response is malformed";
    case UpstreamFailure::too_large:
      return "the engine's response is too large";
    case UpstreamFailure::local:
      return "the gateway is out of resources";
    case UpstreamFailure::ejected:
      return "the engine was taken out of service";
    case UpstreamFailure::aborted:
      return "the client went away";
    case UpstreamFailure::none:
      break;
  }
  return "unknown failure";
}

GatewayError stage_failure(Stage stage, const UpstreamError& e) {
  const std::string prefix = std::string(to_string(stage)) + " stage failed: ";
  GatewayError g = upstream_error(502, prefix + public_reason(e.kind));
  g.detail = prefix + e.detail;
  return g;
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
  const std::string answered =
      std::string(to_string(stage)) + " stage: the engine answered " + std::to_string(status);
  if (status >= 400 && status < 500) {
    GatewayError g = upstream_error(status, answered);
    g.detail = std::string(to_string(stage)) + " stage: " + inst.spec.url + " answered " +
               std::to_string(status);
    if (!err && !body.empty()) {
      g.passthrough_body = std::move(body);
      auto ct = ex.header().find(http::field::content_type);
      if (ct != ex.header().end())
        g.passthrough_content_type = std::string(ct->value());
    }
    co_return g;
  }
  GatewayError g =
      upstream_error(502, std::string(to_string(stage)) + " stage failed: the engine answered " +
                              std::to_string(status));
  g.detail = std::string(to_string(stage)) + " stage failed: " + inst.spec.url + " answered " +
             std::to_string(status) + ": " + snippet(body);
  co_return g;
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

// Decode answered 2xx and the client's first bytes are ready: a stream's
// first events (or its end), or a whole answer's body. Handed from the
// routing coroutine to the relay. Routing's frame (several KiB: GCC gives
// every local of every branch its own slot), the JSON index and the
// upstream request are freed before the relay starts: a stream can idle
// for minutes, and 10,000 of them must fit in 100 MiB.
struct DecodeRelay {
  std::unique_ptr<RequestView> view;
  std::unique_ptr<InFlightGuard> guard;
  std::unique_ptr<StageReport> report;  // refers to view->ctx
  std::unique_ptr<UpstreamExchange> ex;
  InstancePtr decode;
  std::optional<std::string> conversation;
  std::unique_ptr<StreamRelay> stream;  // null: a whole answer
  std::string first;                    // the stream's first events, or the whole body
};

// One decode attempt's outcome: `relay` when decode answered 2xx and the
// client's first bytes are ready, else the failure and whether another
// decode may be tried.
struct DecodeAttempt {
  std::unique_ptr<DecodeRelay> relay;
  std::optional<GatewayError> error;
  bool retriable = false;
  bool reached_engine = true;
  bool client_gone = false;
};

// Sends the request to `decode` and reads until the client can be sent
// something: for a stream its first complete event, for a whole answer
// its body. Up to that point the client has received nothing, so every
// failure (a refused connection, a 5xx, a decode that answers its header
// and dies before its first token) can still go to another decode.
net::awaitable<DecodeAttempt> attempt_decode(
    WorkerContext& w, const http::request<http::string_body>& req,
    std::unique_ptr<RequestView>& view, const InstancePtr& decode, const SplicedText& body,
    const std::string& stage_id, const ForwardedHeaders& fwd, RequestScope& scope, bool stream,
    const std::optional<std::string>& conversation) {
  DecodeAttempt a;
  auto r = std::make_unique<DecodeRelay>();
  r->guard = std::make_unique<InFlightGuard>(decode);
  r->report = std::make_unique<StageReport>(w.picker, decode, view->ctx);
  r->decode = decode;
  r->conversation = conversation;
  auto failed = [&](const UpstreamError& e) {
    if (e.kind == UpstreamFailure::aborted) {
      a.client_gone = true;
      return;
    }
    const auto c = classify_failure(e);
    if (c.engine_fault)
      note_failure(w, *decode, e.detail);
    a.retriable = c.retriable;
    a.reached_engine = c.reached_engine;
    a.error = e.kind == UpstreamFailure::local ? local_failure(Stage::decode, e)
                                               : stage_failure(Stage::decode, e);
  };
  const auto head =
      upstream_head(http::verb::post, *decode, req.target(), body.size(), stage_id, fwd);
  const auto buffers = body_buffers(body);
  auto [err, ex] =
      co_await UpstreamExchange::start(w.pools.for_instance(decode), head, buffers, scope,
                                       w.timeouts(), stream ? kStreamRead : kWholeAnswerRead);
  if (err) {
    failed(err);
    co_return a;
  }
  r->report->first_byte(ex->status());
  if (ex->status() >= 500) {
    note_failure(w, *decode, "answered " + std::to_string(ex->status()));
    a.error = co_await engine_status_error(Stage::decode, *ex, *decode);
    a.retriable = true;
    a.client_gone = scope.client_gone();
    co_return a;
  }
  if (ex->status() < 200 || ex->status() >= 300) {
    // The request's own fault (4xx): relayed, never held against decode.
    a.error = co_await engine_status_error(Stage::decode, *ex, *decode);
    a.client_gone = scope.client_gone();
    co_return a;
  }
  if (stream) {
    r->stream = std::make_unique<StreamRelay>(w, *ex, *decode, view->request_id, r->conversation);
    while (r->first.empty() && !r->stream->done()) {
      if (auto rerr = co_await r->stream->read_into(r->first); rerr) {
        failed(rerr);
        co_return a;
      }
    }
  } else {
    if (auto rerr =
            co_await ex->read_all(r->first, std::max<std::size_t>(w.cfg.max_body_bytes, 64u << 20));
        rerr) {
      failed(rerr);
      co_return a;
    }
    ex->finish();
  }
  decode->note_request_success();
  // The decode stage counts as succeeded once its first bytes are in:
  // what happens while relaying is the stream's own business.
  r->report->succeeded();
  r->ex = std::move(ex);
  r->view = std::move(view);
  a.relay = std::move(r);
  co_return a;
}

// Validation, policies, encode, prefill and decode up to its first bytes
// (with failover). Returns whether the client connection may be reused,
// unless it sets `relay`: then decode answered 2xx and the caller relays.
net::awaitable<bool> route_completion(WorkerContext& w, beast::tcp_stream& client,
                                      http::request<http::string_body>& req, RequestScope& scope,
                                      bool is_chat, std::unique_ptr<DecodeRelay>& relay) {
  auto view = std::make_unique<RequestView>();
  view->request_id = request_id_for(w, req);
  const std::string& request_id = view->request_id;
  auto ct = req.find(http::field::content_type);
  if (ct == req.end() || !is_json_content_type(ct->value())) {
    co_return co_await send_error(
        w, client, req,
        client_error(415, "Unsupported Media Type: Content-Type must be application/json"),
        request_id, &scope);
  }
  const std::string_view body = req.body();
  auto index = index_json_object(body);
  if (!index) {
    co_return co_await send_error(
        w, client, req, client_error(400, "request body is not valid JSON: " + index.error()),
        request_id, &scope);
  }
  auto facts = read_facts(body, *index, is_chat);
  if (!facts)
    co_return co_await send_error(w, client, req, client_error(400, facts.error()), request_id,
                                  &scope);

  const ForwardedHeaders fwd = forwarded_headers(w, req);
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
        co_await run_encode_stage(w, *set, body, *index, ctx, request_id, fwd, scope);
    if (scope.client_gone())
      co_return false;
    if (encode_error)
      co_return co_await send_error(w, client, req, *encode_error, request_id);
  }

  // Failover. A request that never reached an engine (its connection was
  // refused) may go elsewhere whatever the budget: it cost no engine
  // anything. Otherwise one retry per request at most, within the retry
  // budget.
  RetryToken retry;
  int free_retries = kNeverSentRetries;
  auto may_retry = [&](bool reached_engine) {
    if (!reached_engine && free_retries > 0) {
      --free_retries;
      return true;
    }
    return retry.take(w);
  };
  double prefill_seconds = 0;
  // Stage 1: prefill, unless the decode instances are combined P+D ones.
  const KvConnector& connector = *w.connector;
  const bool one_hop = w.cfg.prefill_disabled || !connector.has_prefill();
  // One hop has no prefill to hand blocks to, and only NIXL's params can
  // name a previous turn's blocks: no reuse otherwise.
  const bool reuse = !one_hop && connector.passes_params();
  const std::optional<std::string> conversation = reuse ? ctx.conversation_id : std::nullopt;
  // Slices of `body` plus edits; small however long the prompt.
  SplicedText decode_body;
  InstancePtr prefill;
  InstancePtr decode;
  std::string stage_id = request_id;
  // Runs the prefill, failing over to other prefill instances; the
  // result's instance is null when it failed.
  std::vector<const Instance*> tried_prefill;
  auto prefill_with_failover = [&](std::string_view params) -> net::awaitable<PrefillResult> {
    for (bool retrying = false;; retrying = true) {
      PrefillResult pre = co_await run_prefill(w, *set, req, body, *index, params, decode.get(),
                                               ctx, request_id, fwd, scope, tried_prefill);
      // A retried prefill is over: its unit of budget goes back (the
      // decode that follows is no retry).
      if (retrying)
        retry.release();
      if (!pre.error || scope.client_gone() || !pre.retriable)
        co_return pre;
      tried_prefill.push_back(pre.instance.get());
      if (!has_alternative(set->prefill, tried_prefill) || !may_retry(pre.reached_engine))
        co_return pre;
      if (w.metrics)
        w.metrics->retries_prefill.fetch_add(1, std::memory_order_relaxed);
      spdlog::info("request {}: prefill on {} failed, retrying on another instance", request_id,
                   pre.instance->spec.url);
    }
  };
  if (one_hop) {
    decode_body = connector.decode_body(body, *index, std::nullopt);
  } else {
    if (connector.names_peers()) {
      // The request id names both peers, so decode is chosen first.
      ctx.stage = Stage::decode;
      decode = w.picker.pick(set->decode, ctx);
      if (!decode)
        co_return co_await send_error(w, client, req, no_instance(Stage::decode), request_id);
      if (decode->spec.kv_peer.empty()) {
        co_return co_await send_error(w, client, req, missing_kv_peer(*decode), request_id);
      }
    }
    // Multi-turn reuse: the previous turn's decode blocks, taken (once,
    // across replicas) for this prefill to read.
    std::string prefill_params(kDefaultPrefillKvParams);
    const auto prefill_started = std::chrono::steady_clock::now();
    if (w.conversations) {
      prefill_params = co_await prefill_kv_params_for_turn(
          *w.conversations, w.conversation_stores->counters(), conversation, request_id);
      if (scope.client_gone())
        co_return false;
    }
    PrefillResult pre = co_await prefill_with_failover(prefill_params);
    if (scope.client_gone())
      co_return false;
    if (pre.error) {
      scope.stage = "prefill";
      co_return co_await send_error(w, client, req, *pre.error, request_id, &scope);
    }
    prefill = pre.instance;
    stage_id = pre.request_id;
    decode_body = connector.decode_body(body, *index, pre.kv_params_view());
    prefill_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_started).count();
  }

  // Stage 2: decode, with the prefill's params attached, up to the
  // client's first bytes. A decode that fails before them is retried on
  // another decode: one the request never reached with the same body; one
  // that may have pulled the prefill's blocks after a fresh prefill. With
  // p2p-nccl the decode was chosen before the prefill (the request id
  // names both), so it is not retried there.
  std::vector<const Instance*> tried_decode;
  for (;;) {
    ctx.stage = Stage::decode;
    ctx.chosen_prefill = prefill.get();
    if (!decode || !tried_decode.empty())
      decode = w.picker.pick(untried(set->decode, tried_decode), ctx);
    if (!decode) {
      scope.stage = "decode";
      co_return co_await send_error(w, client, req, no_instance(Stage::decode), request_id, &scope);
    }
    const auto decode_started = std::chrono::steady_clock::now();
    if (w.metrics && tried_decode.empty()) {
      w.metrics->overhead_seconds.observe(
          std::chrono::duration<double>(decode_started - scope.received).count() - prefill_seconds);
    }
    DecodeAttempt a = co_await attempt_decode(w, req, view, decode, decode_body, stage_id, fwd,
                                              scope, facts->stream, conversation);
    if (a.client_gone || scope.client_gone())
      co_return false;
    if (a.relay) {
      // Nothing is retried once decode answered: a retry that got here is
      // over, and the stream that follows (minutes, maybe) holds no budget.
      retry.release();
      if (w.metrics) {
        w.metrics->decode_ttft_seconds.observe(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - decode_started)
                .count());
      }
      scope.status = a.relay->ex->status();
      scope.stage = "decode";
      relay = std::move(a.relay);
      co_return true;
    }
    tried_decode.push_back(decode.get());
    if (a.retriable && !connector.names_peers() && has_alternative(set->decode, tried_decode) &&
        may_retry(a.reached_engine)) {
      if (w.metrics)
        w.metrics->retries_decode.fetch_add(1, std::memory_order_relaxed);
      spdlog::info("request {}: decode on {} failed before its first byte, retrying", request_id,
                   decode->spec.url);
      if (one_hop || !a.reached_engine)
        continue;
      // The first prefill's blocks were meant for (and may have been
      // pulled by) the failed decode: the next one gets fresh ones.
      tried_prefill.clear();
      PrefillResult again = co_await prefill_with_failover(kDefaultPrefillKvParams);
      if (scope.client_gone())
        co_return false;
      if (!again.error) {
        prefill = again.instance;
        stage_id = again.request_id;
        decode_body = connector.decode_body(body, *index, again.kv_params_view());
        continue;
      }
      a.error = again.error;
    }
    scope.stage = "decode";
    co_return co_await send_error(w, client, req, *a.error, request_id, &scope);
  }
}

// Relays the rest of decode's stream after its first events went out with
// the header. If decode breaks off now, the client gets an in-band error
// event and the stream ends: never an invented finish_reason or [DONE].
net::awaitable<bool> relay_stream(WorkerContext& w, beast::tcp_stream& client,
                                  const http::request<http::string_body>& req, DecodeRelay& r,
                                  RequestScope& scope) {
  UpstreamExchange& ex = *r.ex;
  if (!co_await write_stream_start(w, client, req, ex, r.view->request_id, r.first)) {
    scope.on_client_gone();
    co_return false;
  }
  // Bytes reached the client: no failover from here on.
  ex.committed();
  // The engine's header fields are no longer needed (status and framing
  // are kept by the parser).
  ex.drop_header_fields();
  std::string().swap(r.first);
  std::string out;
  UpstreamError failure;
  while (!r.stream->done()) {
    if (auto err = co_await r.stream->read_into(out); err) {
      if (err.kind == UpstreamFailure::aborted)
        co_return false;
      failure = std::move(err);
      break;
    }
    if (!out.empty() && !co_await write_chunk(client, out, w.cfg)) {
      scope.on_client_gone();
      co_return false;
    }
    std::string().swap(out);
  }
  if (failure) {
    spdlog::warn("request {}: decode stream broke off: {}", r.view->request_id, failure.detail);
    note_failure(w, *r.decode, failure.detail);
    const std::string why = w.cfg.verbose_errors ? failure.detail : public_reason(failure.kind);
    const std::string ev =
        sse_data_event(error_json(502, "decode stage failed mid-stream: " + why));
    if (!co_await write_chunk(client, ev, w.cfg))
      co_return false;
  } else {
    ex.finish();
  }
  client.expires_after(w.cfg.client_idle_timeout);
  auto [ec, n] = co_await net::async_write(client, http::make_chunk_last(), use_tuple);
  co_return !ec && req.keep_alive();
}

// A whole decode answer, through the filter (its own frame, so the filter
// takes no room in serve_completion's while a stream relays).
net::awaitable<bool> relay_decode_whole(WorkerContext& w, beast::tcp_stream& client,
                                        const http::request<http::string_body>& req,
                                        DecodeRelay& r) {
  r.ex->committed();
  DecodeOutputFilter filter(r.decode->spec.host, w.cfg.expose_kv_params);
  filter.on_body(r.first);
  if (filter.take_new_capture() && r.conversation && w.conversations) {
    co_await remember_turn(*w.conversations, *r.conversation, *filter.captured(),
                           w.cfg.conversation_ttl, r.view->request_id);
  }
  co_return co_await write_whole_answer(w, client, req, *r.ex, std::move(r.first),
                                        r.view->request_id);
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
  if (relay->stream)
    co_return co_await relay_stream(w, client, req, *relay, scope);
  co_return co_await relay_decode_whole(w, client, req, *relay);
}

net::awaitable<bool> serve_models(WorkerContext& w, beast::tcp_stream& client,
                                  http::request<http::string_body>& req, RequestScope& scope) {
  const std::string request_id = request_id_for(w, req);
  const auto set = w.registry.snapshot();
  PickContext ctx;
  ctx.stage = Stage::decode;
  InstancePtr decode = w.picker.pick(set->decode, ctx);
  if (!decode)
    co_return co_await send_error(w, client, req, no_instance(Stage::decode), request_id, &scope);
  auto up = upstream_request(http::verb::get, *decode, "/v1/models", {}, request_id,
                             forwarded_headers(w, req));
  auto [err, ex] =
      co_await UpstreamExchange::start(w.pools.for_instance(decode), up, scope, w.timeouts());
  if (err) {
    if (err.kind == UpstreamFailure::aborted)
      co_return false;
    co_return co_await send_error(w, client, req, stage_failure(Stage::decode, err), request_id,
                                  &scope);
  }
  std::string answer;
  if (auto rerr = co_await ex->read_all(answer, kMaxErrorBody); rerr) {
    if (rerr.kind == UpstreamFailure::aborted)
      co_return false;
    co_return co_await send_error(w, client, req, stage_failure(Stage::decode, rerr), request_id,
                                  &scope);
  }
  ex->finish();
  co_return co_await write_whole_answer(w, client, req, *ex, std::move(answer), request_id);
}

}  // namespace pdgate
