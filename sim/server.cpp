// pdgate-sim's event loop: one io_context, one coroutine per connection.
// This file accepts connections, reads their requests and routes each one:
// generation requests to the Generator (generation.hpp), KV pulls to the
// KV hand-off (kv_transfer.hpp), and the endpoints answered at once
// (models, health, profiling, metrics, /sim/*, tokenize) here.
// While a generation request runs, a second coroutine reads the socket: EOF
// means the client left, and `||` cancels the work at whatever await it
// sits in (watched(), http_exchange.hpp).
#include "sim/server.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <openssl/ssl.h>
#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "core/net/maybe_tls_stream.hpp"
#include "sim/cache_events.hpp"
#include "sim/faults.hpp"
#include "sim/generation.hpp"
#include "sim/generation_request.hpp"
#include "sim/http_exchange.hpp"
#include "sim/kv_event_publisher.hpp"
#include "sim/kv_transfer.hpp"
#include "sim/metrics.hpp"
#include "sim/one_hop_api.hpp"
#include "sim/prefix_cache.hpp"
#include "sim/random_ids.hpp"
#include "sim/request_log.hpp"
#include "sim/responses.hpp"
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

// One engine core: with --data-parallel-size N the API server fronts N of
// them, each a data-parallel rank with its own scheduler, prefix cache,
// KV hand-off (engine id `<id>_dp<rank>`) and KV-event socket.
struct EngineCore {
  EngineCore(SimOptions o, spdlog::logger& log, std::mt19937_64& rng, Counters& counters,
             Faults& faults, std::uint16_t port, std::unique_ptr<KvEventPublisher> ev)
      : opts(std::move(o)),
        events(std::move(ev)),
        cache(opts.block_size, opts.kv_blocks, opts.prefix_cache),
        cache_events(cache, events.get(), opts, log),
        kv(opts, log, rng, counters, cache, cache_events, port),
        generator(opts, log, counters, faults, kv, cache, cache_events) {}

  CoreGauges gauges(std::chrono::steady_clock::time_point now) {
    const double used =
        static_cast<double>(generator.active_blocks() + kv.registry().outstanding_blocks(now));
    return {generator.running(), generator.waiting(),
            std::min(1.0, used / static_cast<double>(opts.kv_blocks))};
  }

  const SimOptions opts;  // this core's: its rank and engine id
  std::unique_ptr<KvEventPublisher> events;
  PrefixCache cache;
  CacheEvents cache_events;
  KvTransfer kv;
  Generator generator;
};

class Server {
 public:
  // `events` publishes KV events, one publisher per engine core (empty
  // when they are off).
  Server(const SimOptions& o, std::shared_ptr<spdlog::logger> log, std::uint16_t port,
         std::vector<std::unique_ptr<KvEventPublisher>> events)
      : opts_(o),
        log_(std::move(log)),
        rng_(o.seed ? *o.seed : std::random_device{}()),
        port_(port),
        faults_(opts_, rng_, counters_),
        started_at_(std::time(nullptr)),
        permission_id_("modelperm-" + random_hex(rng_, 32)) {
    // Never from the seeded RNG: two sims started with the same --seed
    // must still have distinct engine ids.
    const std::string base_id =
        o.engine_id.empty() ? random_uuid(std::random_device{}()) : o.engine_id;
    for (std::size_t r = 0; r < o.data_parallel_size; ++r) {
      SimOptions core = o;
      core.data_parallel_rank = r;
      // vLLM appends the rank to a data-parallel engine's KV engine id.
      core.engine_id = o.data_parallel_size > 1 ? base_id + "_dp" + std::to_string(r) : base_id;
      cores_.push_back(
          std::make_unique<EngineCore>(std::move(core), *log_, rng_, counters_, faults_, port,
                                       r < events.size() ? std::move(events[r]) : nullptr));
    }
  }

  const std::string& engine_id() const { return cores_.front()->kv.engine_id(); }
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
    static constexpr std::string_view kKnown[] = {"/v1/completions", "/v1/chat/completions",
                                                  "/v1/models",      "/health",
                                                  "/start_profile",  "/stop_profile",
                                                  "/metrics",        "/sim/requests",
                                                  "/sim/stats",      "/sim/kv/pull",
                                                  "/tokenize",       "/reset_prefix_cache",
                                                  "/v1/responses",   "/query"};
    for (auto k : kKnown) {
      if (path == k)
        return std::string(k);
    }
    if (is_one_hop_path(path))
      return std::string(path);
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

    // Mooncake's bootstrap server is a server of its own in vLLM: it
    // answers while the engine hangs.
    if (opts_.hang && !sim_path && path != "/query")
      co_return co_await faults_.hang(x);
    if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/responses") {
      if (req.method() == http::verb::post) {
        const SimApi api = path == "/v1/chat/completions" ? SimApi::chat
                           : path == "/v1/responses"      ? SimApi::responses
                                                          : SimApi::completions;
        EngineCore* core = pick_core(req);
        if (core == nullptr) {
          co_return co_await reply(x, http::status::bad_request,
                                   dump(make_error(bad_rank_message(req), 400)),
                                   "application/json");
        }
        if (x.rec)
          x.rec->data_parallel_rank = core->opts.data_parallel_rank;
        co_return co_await watched(x, core->generator.generate(x, api));
      }
    }
    if (path == "/sim/kv/pull" && req.method() == http::verb::post) {
      co_return co_await core_for_pull(req.body()).kv.serve_pull(x);
    }
    if (is_one_hop_path(path) && req.method() == http::verb::post) {
      OneHopAnswer a = answer_one_hop(path, req[http::field::content_type], req.body(), opts_.model,
                                      x.rid, static_cast<std::int64_t>(std::time(nullptr)));
      co_return co_await reply(x, static_cast<http::status>(a.status), std::move(a.body),
                               a.content_type);
    }
    // Mooncake's bootstrap server (vLLM's MooncakeBootstrapServer), here on
    // the API port: the engine id of each data-parallel rank.
    if (path == "/query" && req.method() == http::verb::get && opts_.kv_connector == "mooncake" &&
        opts_.role != SimRole::decode) {
      nlohmann::json q;
      for (const auto& core : cores_)
        q[std::to_string(core->opts.data_parallel_rank)] = {{"engine_id", core->kv.engine_id()}};
      co_return co_await reply(x, http::status::ok, q.dump(), "application/json");
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
    if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/responses" ||
        is_one_hop_path(path))
      return not_allowed;
    if (path == "/sim/kv/pull" || path == "/tokenize")
      return not_allowed;
    if (path == "/reset_prefix_cache") {
      if (method != http::verb::post)
        return not_allowed;
      for (auto& core : cores_)
        core->cache_events.clear();
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
      const auto events_json = [](KvEventPublisher& ev) {
        const KvEventPublisher::Stats k = ev.stats();
        return ojson{{"endpoint", ev.endpoint()}, {"replay_endpoint", ev.replay_endpoint()},
                     {"published", k.published},  {"dropped", k.dropped},
                     {"replays", k.replays},      {"next_seq", k.next_seq}};
      };
      if (cores_.front()->events)
        s["kv_events"] = events_json(*cores_.front()->events);
      if (cores_.size() > 1) {
        ojson ranks = ojson::array();
        const auto now = std::chrono::steady_clock::now();
        for (const auto& core : cores_) {
          const CoreGauges g = core->gauges(now);
          ojson r{{"rank", core->opts.data_parallel_rank},
                  {"engine_id", core->kv.engine_id()},
                  {"running", g.running},
                  {"waiting", g.waiting},
                  {"prefix_cache_blocks", core->cache.size()}};
          if (core->events)
            r["kv_events"] = events_json(*core->events);
          ranks.push_back(std::move(r));
        }
        s["data_parallel_ranks"] = std::move(ranks);
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

  // ---- helpers ----------------------------------------------------------

  Gauges gauges() {
    const auto now = std::chrono::steady_clock::now();
    Gauges g;
    double usage = 0;
    for (const auto& core : cores_) {
      const CoreGauges c = core->gauges(now);
      g.cores.push_back(c);
      g.running += c.running;
      g.waiting += c.waiting;
      usage += c.kv_cache_usage;
      g.issued_kv_outstanding += core->kv.registry().outstanding(now);
      g.prefix_cache_blocks += core->cache.size();
    }
    g.kv_cache_usage = usage / static_cast<double>(cores_.size());
    g.open_connections = open_connections_;
    g.connections_total = connections_total_;
    return g;
  }

  // The core a generation request goes to: the one its
  // X-data-parallel-rank header names, else the least busy (vLLM's
  // internal balancer scores waiting x 4 + running); nullptr when the
  // header is not a rank this server has.
  EngineCore* pick_core(const Request& req) {
    if (auto it = req.find("x-data-parallel-rank"); it != req.end()) {
      const std::string_view v = it->value();
      std::size_t rank = 0;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), rank);
      if (ec != std::errc() || end != v.data() + v.size() || rank >= cores_.size())
        return nullptr;
      return cores_[rank].get();
    }
    EngineCore* best = cores_.front().get();
    std::size_t best_score = SIZE_MAX;
    for (const auto& core : cores_) {
      const std::size_t score = core->generator.waiting() * 4 + core->generator.running();
      if (score < best_score) {
        best = core.get();
        best_score = score;
      }
    }
    return best;
  }

  std::string bad_rank_message(const Request& req) const {
    return "data_parallel_rank " + std::string(req["x-data-parallel-rank"]) +
           " is out of range [0, " + std::to_string(cores_.size()) + ").";
  }

  // A KV pull names the engine it pulls from: the core with that engine
  // id answers (the first one otherwise, which refuses an unknown id).
  EngineCore& core_for_pull(const std::string& body) {
    if (cores_.size() > 1) {
      const json j = json::parse(body, nullptr, false);
      if (j.is_object()) {
        if (auto it = j.find("remote_engine_id"); it != j.end() && it->is_string()) {
          for (const auto& core : cores_) {
            if (core->kv.engine_id() == it->get_ref<const std::string&>())
              return *core;
          }
        }
      }
    }
    return *cores_.front();
  }

  SimOptions opts_;
  std::shared_ptr<spdlog::logger> log_;
  // The one seeded RNG: request ids, remote_request_ids and --error-rate.
  std::mt19937_64 rng_;
  std::uint16_t port_;
  Counters counters_;
  RequestLog requests_;
  Faults faults_;
  std::vector<std::unique_ptr<EngineCore>> cores_;
  std::size_t open_connections_ = 0;
  std::uint64_t connections_total_ = 0;
  std::int64_t started_at_;
  std::string permission_id_;
  net::ssl::context* tls_ = nullptr;
};

}  // namespace

int run_server(const SimOptions& opts) {
  auto log = spdlog::stderr_color_st("pdgate-sim");
  log->set_level(spdlog::level::from_str(opts.log_level));
  log->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");

  // Both outlive the io_context: the requests SIGTERM cuts off are
  // coroutines still queued in it, destroyed with it, and they hold
  // references into the server's engine cores and the TLS context.
  net::ssl::context tls(net::ssl::context::tls_server);
  std::optional<Server> server;
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

  // One publisher per engine core, each on the endpoint moved by its rank
  // as vLLM does (tcp: port + rank; ipc/inproc: a _dp<rank> suffix).
  std::vector<std::unique_ptr<KvEventPublisher>> events;
  if (opts.kv_events.enabled && opts.kv_events.publisher == "zmq") {
    for (std::size_t r = 0; r < opts.data_parallel_size; ++r) {
      KvEventsConfig cfg = opts.kv_events;
      cfg.endpoint = offset_endpoint(cfg.endpoint, r);
      cfg.replay_endpoint = offset_endpoint(cfg.replay_endpoint, r);
      std::string error;
      auto ev = KvEventPublisher::open(cfg, error);
      if (!ev) {
        std::fprintf(stderr, "pdgate-sim: --kv-events-config (rank %zu): %s\n", r, error.c_str());
        return 2;
      }
      // On stderr: stdout carries only the "listening on" line. Written
      // before it, so whoever waits for that line can already read these
      // (or ask /sim/stats).
      std::fprintf(stderr, "pdgate-sim kv events on %s\n", ev->endpoint().c_str());
      if (!ev->replay_endpoint().empty())
        std::fprintf(stderr, "pdgate-sim kv events replay on %s\n", ev->replay_endpoint().c_str());
      events.push_back(std::move(ev));
    }
  }

  server.emplace(opts, log, port, std::move(events));
  if (!opts.tls_cert.empty() || !opts.tls_key.empty()) {
    tls.use_certificate_chain_file(opts.tls_cert, ec);
    if (!ec)
      tls.use_private_key_file(opts.tls_key, net::ssl::context::pem, ec);
    if (ec) {
      std::fprintf(stderr, "pdgate-sim: --tls-cert/--tls-key: %s\n", ec.message().c_str());
      return 2;
    }
    server->set_tls(&tls);
  }
  const std::string shown = addr.is_v6() ? "[" + opts.host + "]" : opts.host;
  std::printf("pdgate-sim listening on %s://%s:%u\n", opts.tls_cert.empty() ? "http" : "https",
              shown.c_str(), static_cast<unsigned>(port));
  std::fflush(stdout);
  log->info("role={} model={} engine_id={} advertise={}:{}", to_string(opts.role), opts.model,
            server->engine_id(), opts.advertise_host, port);

  net::co_spawn(io, server->listen(std::move(acceptor)), net::detached);
  net::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&io](const boost::system::error_code&, int) { io.stop(); });
  io.run();
  return 0;
}

}  // namespace pdgate::sim
