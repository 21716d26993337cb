// pdgate-sim's event loop: one io_context, one coroutine per connection.
//
// Shape of a generation request: validate -> faults -> admission (FIFO queue
// bounded by --max-num-seqs) -> KV pull (decode side, or a prefill handed the
// decode's blocks) -> prefix-cache lookup -> prefill (one of --prefill-lanes)
// -> one decode step per output token -> issue kv params -> final answer.
// While that runs, a second coroutine reads the socket: EOF means the client
// left, and `||` cancels the work at whatever await it sits in.
#include "sim/server.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <openssl/ssl.h>
#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "core/net/maybe_tls_stream.hpp"
#include "sim/cache_events.hpp"
#include "sim/faults.hpp"
#include "sim/generation_request.hpp"
#include "sim/http_exchange.hpp"
#include "sim/kv_event_publisher.hpp"
#include "sim/kv_transfer.hpp"
#include "sim/latency.hpp"
#include "sim/metrics.hpp"
#include "sim/prefix_cache.hpp"
#include "sim/random_ids.hpp"
#include "sim/request_log.hpp"
#include "sim/responses.hpp"
#include "sim/scheduler.hpp"
#include "sim/tokenizer.hpp"

namespace pdgate::sim {

namespace {

using nlohmann::json;

constexpr std::size_t kMaxBodyBytes = 64u << 20;
constexpr std::size_t kMaxHeaderBytes = 64u << 10;
constexpr std::size_t kMaxRecordedBody = 4u << 20;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

class Server {
 public:
  // `events` publishes KV events; null when they are off.
  Server(const SimOptions& o, std::shared_ptr<spdlog::logger> log, std::uint16_t port,
         KvEventPublisher* events)
      : opts_(o),
        log_(std::move(log)),
        events_(events),
        rng_(o.seed ? *o.seed : std::random_device{}()),
        port_(port),
        latency_{o.prefill_base_ms, o.prefill_us_per_token, o.itl_ms, o.kv_pull_ms},
        cache_(o.block_size, o.kv_blocks, o.prefix_cache),
        cache_events_(cache_, events, opts_, *log_),
        scheduler_(o.max_num_seqs, o.max_waiting),
        prefill_lanes_(o.prefill_lanes, std::numeric_limits<std::size_t>::max()),
        kv_(opts_, *log_, rng_, counters_, cache_, cache_events_, port),
        faults_(opts_, rng_, counters_),
        started_at_(std::time(nullptr)),
        permission_id_("modelperm-" + random_hex(rng_, 32)) {}

  const std::string& engine_id() const { return kv_.engine_id(); }
  // Serve https with `ctx` (it must outlive the server).
  void set_tls(net::ssl::context* ctx) { tls_ = ctx; }

  awaitable<void> listen(tcp::acceptor acceptor) {
    for (;;) {
      auto [ec, sock] = co_await acceptor.async_accept(use_nothrow);
      if (ec) {
        if (ec == net::error::operation_aborted)
          co_return;
        log_->warn("accept failed: {}", ec.message());
        co_await sleep_for(std::chrono::milliseconds(10));  // e.g. EMFILE: do not spin
        continue;
      }
      boost::system::error_code ignored;
      sock.set_option(tcp::no_delay(true), ignored);
      net::co_spawn(acceptor.get_executor(), session(std::move(sock)), net::detached);
    }
  }

 private:
  // ---- connection -------------------------------------------------------

  awaitable<void> session(tcp::socket socket) {
    ++open_connections_;
    ++connections_total_;
    struct Dec {
      std::size_t& n;
      ~Dec() { --n; }
    } dec{open_connections_};
    MaybeTlsStream sock(std::move(socket));
    std::optional<std::string> sni;
    try {
      if (tls_) {
        auto& t = sock.start_tls(*tls_);
        sock.expires_after(std::chrono::seconds(10));
        auto [hec] = co_await t.async_handshake(net::ssl::stream_base::server, use_nothrow);
        sock.expires_never();
        if (hec) {
          log_->info("TLS handshake failed: {}", hec.message());
          sock.close();
          co_return;
        }
        if (const char* name = SSL_get_servername(t.native_handle(), TLSEXT_NAMETYPE_host_name))
          sni = name;
      }
      beast::flat_buffer buf;
      for (;;) {
        http::request_parser<http::string_body> parser;
        parser.header_limit(kMaxHeaderBytes);
        parser.body_limit(kMaxBodyBytes);
        auto [ec, n] = co_await http::async_read_header(sock, buf, parser, use_nothrow);
        if (!ec && beast::iequals(parser.get()[http::field::expect], "100-continue")) {
          // curl sends this for large bodies and would otherwise stall a
          // second before sending the body.
          static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
          auto [wec, wn] = co_await net::async_write(sock, net::buffer(kContinue), use_nothrow);
          ec = wec;
        }
        if (!ec && !parser.is_done()) {
          auto [rec, rn] = co_await http::async_read(sock, buf, parser, use_nothrow);
          ec = rec;
        }
        if (ec) {
          if (ec == http::error::body_limit || ec == http::error::header_limit) {
            Request dummy;
            Exchange x(sock, buf, dummy, counters_, *log_);
            std::string too_large = dump(make_error("request too large", 413));
            co_await reply(x, http::status::payload_too_large, std::move(too_large),
                           "application/json", false);
          }
          break;
        }
        Request req = parser.release();
        if (!co_await dispatch(sock, buf, req, sni))
          break;
      }
    } catch (const std::exception& e) {
      log_->error("session failed: {}", e.what());
    }
    boost::system::error_code ignored;
    sock.socket().shutdown(tcp::socket::shutdown_both, ignored);
    sock.close();
  }

  static std::string route_label(std::string_view path) {
    static constexpr std::string_view kKnown[] = {
        "/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
        "/start_profile",  "/stop_profile",        "/metrics",   "/sim/requests",
        "/sim/stats",      "/sim/kv/pull",         "/tokenize",  "/reset_prefix_cache"};
    for (auto k : kKnown) {
      if (path == k)
        return std::string(k);
    }
    return "other";
  }

  // Returns whether the connection stays open.
  awaitable<bool> dispatch(MaybeTlsStream& sock, beast::flat_buffer& buf, Request& req,
                           const std::optional<std::string>& sni) {
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    ++counters_.requests_by_path[route_label(path)];
    const bool sim_path = path.rfind("/sim/", 0) == 0;
    const bool introspection = sim_path || path == "/metrics" || path == "/health";

    Exchange x(sock, buf, req, counters_, *log_);
    if (auto it = req.find("x-request-id"); it != req.end() && !it->value().empty()) {
      x.rid = std::string(it->value());
    }
    if (!introspection) {
      RequestRecord r;
      r.method = std::string(req.method_string());
      r.path = target;
      for (const auto& f : req)
        r.headers.emplace_back(lower(f.name_string()), f.value());
      r.body = req.body().substr(0, kMaxRecordedBody);
      if (!x.rid.empty())
        r.x_request_id = x.rid;
      r.tls_sni = sni;
      r.received_at_ms = now_ms();
      x.rec = requests_.add(std::move(r));
    }
    if (x.rid.empty())
      x.rid = random_hex(rng_, 32);
    if (x.rec)
      x.rec->request_id = x.rid;

    if (opts_.hang && !sim_path)
      co_return co_await faults_.hang(x);
    if (path == "/v1/completions" || path == "/v1/chat/completions") {
      if (req.method() == http::verb::post) {
        co_return co_await watched(x, generate(x, path == "/v1/chat/completions"));
      }
    }
    if (path == "/sim/kv/pull" && req.method() == http::verb::post) {
      co_return co_await kv_.serve_pull(x);
    }
    if (path == "/tokenize" && req.method() == http::verb::post) {
      SimpleAnswer a = tokenize(req.body());
      co_return co_await reply(x, a.status, std::move(a.body), a.content_type);
    }
    SimpleAnswer a = answer_simple(path, req.method());
    co_return co_await reply(x, a.status, std::move(a.body), a.content_type);
  }

  struct SimpleAnswer {
    http::status status = http::status::ok;
    std::string body;
    std::string content_type;
  };

  // Endpoints answered without waiting on anything.
  SimpleAnswer answer_simple(const std::string& path, http::verb method) {
    static const std::string kJson = "application/json";
    const SimpleAnswer not_allowed{http::status::method_not_allowed,
                                   "{\"detail\":\"Method Not Allowed\"}", kJson};
    auto only = [&](http::verb v, SimpleAnswer ok) { return method == v ? ok : not_allowed; };
    if (path == "/v1/completions" || path == "/v1/chat/completions")
      return not_allowed;
    if (path == "/sim/kv/pull" || path == "/tokenize")
      return not_allowed;
    if (path == "/reset_prefix_cache") {
      if (method != http::verb::post)
        return not_allowed;
      cache_events_.clear();
      return {http::status::ok, "", ""};
    }
    if (path == "/health")
      return {http::status::ok, "", ""};
    if (path == "/v1/models") {
      return only(http::verb::get,
                  {http::status::ok,
                   dump(make_models(opts_.model, opts_.max_model_len, started_at_, permission_id_)),
                   kJson});
    }
    if (path == "/start_profile" || path == "/stop_profile") {
      if (method != http::verb::post)
        return not_allowed;
      if (opts_.no_profile)
        return {http::status::not_found, dump(json{{"detail", "Not Found"}}), kJson};
      ++(path == "/start_profile" ? counters_.profile_start : counters_.profile_stop);
      return {http::status::ok, "", ""};
    }
    if (path == "/metrics") {
      return {http::status::ok, render_prometheus(counters_, gauges(), opts_.model),
              "text/plain; version=0.0.4; charset=utf-8"};
    }
    if (path == "/sim/requests") {
      if (method == http::verb::get)
        return {http::status::ok, dump(requests_.to_json()), kJson};
      if (method == http::verb::delete_) {
        requests_.clear();
        return {http::status::ok, "{\"cleared\":true}", kJson};
      }
      return not_allowed;
    }
    if (path == "/sim/stats") {
      ojson s = stats_json(counters_, gauges());
      s["role"] = to_string(opts_.role);
      s["engine_id"] = engine_id();
      s["model"] = opts_.model;
      s["port"] = port_;
      if (events_ != nullptr) {
        const KvEventPublisher::Stats k = events_->stats();
        s["kv_events"] = {{"endpoint", events_->endpoint()},
                          {"replay_endpoint", events_->replay_endpoint()},
                          {"published", k.published},
                          {"dropped", k.dropped},
                          {"replays", k.replays},
                          {"next_seq", k.next_seq}};
      }
      return only(http::verb::get, {http::status::ok, dump(s), kJson});
    }
    return {http::status::not_found, "{\"detail\":\"Not Found\"}", kJson};
  }

  // vLLM's POST /tokenize: a completion prompt or chat messages, tokenized
  // by the sim's rule (sim/tokenizer.hpp), so the ids are those its KV
  // events carry.
  SimpleAnswer tokenize(const std::string& text) {
    static const std::string kJson = "application/json";
    auto error = [&](int code, const std::string& message) {
      return SimpleAnswer{static_cast<http::status>(code), dump(make_error(message, code)), kJson};
    };
    const json body = json::parse(text, nullptr, false);
    if (body.is_discarded())
      return error(400, "Invalid JSON in request body");
    if (!body.is_object())
      return error(400, "Request body must be a JSON object");
    if (std::optional<HttpError> e = check_model(body, opts_.model))
      return error(e->code, e->message);
    const bool chat = body.contains("messages");
    if (!chat && !body.contains("prompt"))
      return error(400, "either 'prompt' or 'messages' is required");
    PromptResult pr = chat ? chat_prompt(body) : completion_prompt(body);
    if (!pr.ok())
      return error(400, pr.error);
    ojson out;
    out["count"] = pr.prompt.tokens;
    out["max_model_len"] = opts_.max_model_len;
    out["tokens"] = token_ids(pr.prompt.text);
    return {http::status::ok, dump(out), kJson};
  }

  // ---- generation -------------------------------------------------------

  awaitable<void> generate(Exchange& x, bool chat) {
    bool failed = false;
    try {
      co_await generate_inner(x, chat);
    } catch (const boost::system::system_error& e) {
      // Cancellation (client gone) surfaces as operation_aborted.
      if (e.code() != net::error::operation_aborted) {
        log_->error("request {} failed: {}", x.rid, e.what());
        failed = true;
      }
    } catch (const std::exception& e) {
      log_->error("request {} failed: {}", x.rid, e.what());
      failed = true;
    }
    if (failed && !x.response_started && !x.client_gone) {
      std::string msg = "internal error in pdgate-sim";
      co_await send_error(x, 500, std::move(msg));
    }
  }

  awaitable<void> generate_inner(Exchange& x, bool chat) {
    RequestRecord& rec = *x.rec;
    GenRequest g;
    if (std::optional<HttpError> err =
            parse_generation(x.req, chat, opts_, counters_, *log_, rec, g)) {
      co_await send_error(x, err->code, err->message);
      co_return;
    }
    const std::size_t prompt_tokens = g.prompt.tokens;
    const bool kv_capable = opts_.role != SimRole::encode;

    // Faults fire before any work is done.
    if (!co_await faults_.before_work(x, g.fault, g.stream))
      co_return;

    if (scheduler_.would_reject()) {
      ++counters_.requests_rejected;
      const std::string msg = "The engine's waiting queue is full (" +
                              std::to_string(opts_.max_waiting) + " requests waiting).";
      co_await send_error(x, 503, msg);
      co_return;
    }

    ResponseMeta meta{(chat ? "chatcmpl-" : "cmpl-") + x.rid, opts_.model,
                      static_cast<std::int64_t>(std::time(nullptr)), chat};
    // Like vLLM (a StreamingResponse), streaming headers go out as soon as
    // the request is accepted, before it is scheduled.
    if (g.stream) {
      if (!co_await write_stream_headers(x))
        co_return;
    }

    Scheduler::Slot slot = co_await scheduler_.acquire();
    if (!slot)
      co_return;  // cancelled while queued
    const std::size_t bs = cache_.block_size();
    BlockHold hold(active_blocks_);
    hold.set((prompt_tokens + bs - 1) / bs);

    // KV transfer.
    const KvTransfer::Received received = co_await kv_.receive(g, x.rid, rec);
    const bool skip_prefill = received.skip_prefill;

    // Prefix cache, then prefill.
    const auto hashes = cache_.block_hashes(g.prompt.text);
    const std::size_t local_cached = cached_prefix_tokens(cache_.match(hashes), bs, prompt_tokens);
    counters_.prefix_cache_queries += prompt_tokens;
    counters_.prefix_cache_hits += local_cached;
    counters_.prompt_tokens += prompt_tokens;
    std::size_t cached = std::max(local_cached, received.remote_cached);
    if (skip_prefill) {
      cached = prompt_tokens;
      const auto pull = latency_.pull();
      if (!co_await sleep_for(pull))
        co_return;
    } else {
      Scheduler::Slot lane = co_await prefill_lanes_.acquire();
      if (!lane)
        co_return;
      const auto prefill = latency_.prefill(prompt_tokens - cached);
      if (!co_await sleep_for(prefill))
        co_return;
    }
    rec.cached_tokens = cached;
    // Blocks computed here or pulled from a prefill are cached, as vLLM
    // caches a request's full blocks once their KV is in place.
    cache_events_.insert(g.prompt.text, hashes);

    ojson issued = nullptr;
    if (g.remote_decode)
      issued = kv_.issue(x.rid, g.prompt.text, prompt_tokens);

    // Decode. The prefill produced the first token; a decode that received
    // the KV from elsewhere runs one step for it.
    std::string text;
    const auto itl = latency_.itl();
    for (std::size_t i = 0; i < g.max_tokens; ++i) {
      if (i > 0 || skip_prefill) {
        if (!co_await sleep_for(itl))
          co_return;
      }
      const std::string token = output_token(i);
      text += token;
      rec.completion_tokens = i + 1;
      ++counters_.generation_tokens;
      hold.set((prompt_tokens + i + 1 + bs - 1) / bs);
      const bool last = i + 1 == g.max_tokens;
      if (last && !g.remote_decode && opts_.issue_decode_kv && kv_capable) {
        // The conversation so far (prompt + this answer) stays on this
        // engine for the next turn's prefill to pull.
        const std::string conv = g.prompt.text + (chat ? "assistant" : "") + text;
        issued = kv_.issue(x.rid, conv, tokens_for_bytes(conv.size()));
      }
      if (!g.stream)
        continue;
      if (i == 0 && chat) {
        std::string role_event = sse_event(make_role_chunk(meta));
        if (!co_await write_event(x, std::move(role_event)))
          co_return;
      }
      ojson chunk = make_token_chunk(meta, token, last ? "length" : "");
      // kv params ride on the last data event before [DONE].
      if (last && !g.include_usage && !issued.is_null())
        chunk["kv_transfer_params"] = issued;
      std::string event = sse_event(chunk);
      if (!co_await write_event(x, std::move(event)))
        co_return;
    }
    rec.kv_params_issued = !issued.is_null();
    const Usage usage{prompt_tokens, g.max_tokens};
    ++counters_.requests_completed;
    if (g.stream) {
      if (g.include_usage) {
        ojson chunk = make_usage_chunk(meta, usage);
        if (!issued.is_null())
          chunk["kv_transfer_params"] = issued;
        std::string event = sse_event(chunk);
        if (!co_await write_event(x, std::move(event)))
          co_return;
      }
      std::string done(kSseDone);
      if (!co_await write_event(x, std::move(done)))
        co_return;
      co_await end_stream(x);
      co_return;
    }
    std::string body = dump(make_response(meta, text, "length", usage, issued));
    co_await reply(x, http::status::ok, std::move(body), "application/json");
  }

  // ---- helpers ----------------------------------------------------------

  Gauges gauges() {
    const auto now = std::chrono::steady_clock::now();
    Gauges g;
    g.running = scheduler_.running();
    g.waiting = scheduler_.waiting();
    const double used =
        static_cast<double>(active_blocks_ + kv_.registry().outstanding_blocks(now));
    g.kv_cache_usage = std::min(1.0, used / static_cast<double>(opts_.kv_blocks));
    g.open_connections = open_connections_;
    g.connections_total = connections_total_;
    g.issued_kv_outstanding = kv_.registry().outstanding(now);
    g.prefix_cache_blocks = cache_.size();
    return g;
  }

  SimOptions opts_;
  std::shared_ptr<spdlog::logger> log_;
  KvEventPublisher* events_;
  std::mt19937_64 rng_;
  std::uint16_t port_;
  LatencyModel latency_;
  PrefixCache cache_;
  CacheEvents cache_events_;
  Scheduler scheduler_;
  Scheduler prefill_lanes_;
  Counters counters_;
  KvTransfer kv_;
  Faults faults_;
  RequestLog requests_;
  std::size_t open_connections_ = 0;
  std::uint64_t connections_total_ = 0;
  std::size_t active_blocks_ = 0;
  std::int64_t started_at_;
  std::string permission_id_;
  net::ssl::context* tls_ = nullptr;
};

}  // namespace

int run_server(const SimOptions& opts) {
  auto log = spdlog::stderr_color_st("pdgate-sim");
  log->set_level(spdlog::level::from_str(opts.log_level));
  log->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");

  net::io_context io(1);
  boost::system::error_code ec;
  const auto addr = net::ip::make_address(opts.host, ec);
  if (ec) {
    std::fprintf(stderr, "pdgate-sim: --host %s is not an IP address\n", opts.host.c_str());
    return 2;
  }
  tcp::acceptor acceptor(io);
  const tcp::endpoint ep(addr, opts.port);
  acceptor.open(ep.protocol(), ec);
  if (!ec)
    acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec)
    acceptor.bind(ep, ec);
  if (!ec)
    acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    std::fprintf(stderr, "pdgate-sim: cannot listen on %s:%u: %s\n", opts.host.c_str(),
                 static_cast<unsigned>(opts.port), ec.message().c_str());
    return 1;
  }
  const std::uint16_t port = acceptor.local_endpoint().port();

  std::unique_ptr<KvEventPublisher> events;
  if (opts.kv_events.enabled && opts.kv_events.publisher == "zmq") {
    std::string error;
    events = KvEventPublisher::open(opts.kv_events, error);
    if (!events) {
      std::fprintf(stderr, "pdgate-sim: --kv-events-config: %s\n", error.c_str());
      return 2;
    }
    // Printed before the listening line, so whoever waits for that line
    // (tests, scripts) already knows where to subscribe.
    std::printf("pdgate-sim kv events on %s\n", events->endpoint().c_str());
    if (!events->replay_endpoint().empty())
      std::printf("pdgate-sim kv events replay on %s\n", events->replay_endpoint().c_str());
  }

  Server server(opts, log, port, events.get());
  net::ssl::context tls(net::ssl::context::tls_server);
  if (!opts.tls_cert.empty() || !opts.tls_key.empty()) {
    tls.use_certificate_chain_file(opts.tls_cert, ec);
    if (!ec)
      tls.use_private_key_file(opts.tls_key, net::ssl::context::pem, ec);
    if (ec) {
      std::fprintf(stderr, "pdgate-sim: --tls-cert/--tls-key: %s\n", ec.message().c_str());
      return 2;
    }
    server.set_tls(&tls);
  }
  const std::string shown = addr.is_v6() ? "[" + opts.host + "]" : opts.host;
  std::printf("pdgate-sim listening on %s://%s:%u\n", opts.tls_cert.empty() ? "http" : "https",
              shown.c_str(), static_cast<unsigned>(port));
  std::fflush(stdout);
  log->info("role={} model={} engine_id={} advertise={}:{}", to_string(opts.role), opts.model,
            server.engine_id(), opts.advertise_host, port);

  net::co_spawn(io, server.listen(std::move(acceptor)), net::detached);
  net::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&io](const boost::system::error_code&, int) { io.stop(); });
  io.run();
  return 0;
}

}  // namespace pdgate::sim
