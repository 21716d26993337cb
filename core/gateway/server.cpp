#include "core/gateway/server.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <cstdio>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include "core/base/use_tuple.hpp"
#include "core/gateway/cluster_ops.hpp"
#include "core/gateway/config_reload.hpp"
#include "core/gateway/health_report.hpp"
#include "core/net/errors.hpp"
#include "core/net/http_body.hpp"
#include "core/net/http_head.hpp"
#include "core/net/request_framing.hpp"
#include "core/net/response_writer.hpp"
#include "core/observability/prometheus.hpp"
#include "core/pipeline/forwarded_headers.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/policy_explain.hpp"
#include "core/pipeline/relay.hpp"
#include "core/routing/conversation.hpp"
#include "core/upstream/health.hpp"

namespace pdgate {

namespace {

using reuse_port = net::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;
// How often a worker drops expired idle engine connections, forgets the
// pools of removed instances, and hands its allocator's freed memory back.
constexpr auto kHousekeepingInterval = std::chrono::seconds(1);

std::string default_authorization() {
  const char* key = std::getenv("OPENAI_API_KEY");
  if (key == nullptr || *key == '\0')
    return {};
  return std::string("Bearer ") + key;
}

nlohmann::json instances_json(const std::vector<InstancePtr>& list, bool addresses) {
  auto arr = nlohmann::json::array();
  for (const auto& i : list) {
    arr.push_back({{"id", i->id},
                   {"url", addresses ? i->spec.url : std::string()},
                   {"role", to_string(i->spec.role)},
                   {"healthy", i->healthy.load()},
                   {"in_flight", i->in_flight.load()},
                   // Every replica's, as shared through Redis (load sharing).
                   {"cluster_in_flight", i->cluster_in_flight()},
                   {"queued_tokens", i->cluster_queued_tokens()},
                   {"prefill_ms_per_token", i->prefill_ms_per_token.load()},
                   {"requests_total", i->requests_total.load()},
                   {"failures_total", i->failures_total.load()}});
  }
  return arr;
}

nlohmann::json host_ports(const std::vector<InstancePtr>& list) {
  auto arr = nlohmann::json::array();
  for (const auto& i : list)
    arr.push_back(i->spec.host + ":" + std::to_string(i->spec.port));
  return arr;
}

http::response<http::string_body> json_response(const http::request<http::string_body>& req,
                                                http::status status, const nlohmann::json& j) {
  http::response<http::string_body> res{status, req.version()};
  res.set(http::field::server, "pdgate");
  res.set(http::field::content_type, "application/json");
  res.keep_alive(req.keep_alive());
  res.body() = j.dump();
  res.prepare_payload();
  return res;
}

// POST /start_profile, /stop_profile: sent to every instance. They reach
// every engine, so they need the admin key when one is set, else a client
// key when API keys are on; open only when neither is configured (as
// vLLM's demo proxy has them).
net::awaitable<bool> serve_profile(ClientRequest& c, const AdminApi& admin, std::string path) {
  if (auto denied = admin.authorize_operator(c.req))
    co_return co_await write_response(c.client, *denied) && c.req.keep_alive();
  if (!admin.has_key()) {
    if (const auto refused = co_await refuse_without_client_key(c))
      co_return *refused;
  }
  WorkerContext& w = c.w;
  MaybeTlsStream& stream = c.client;
  const http::request<http::string_body>& req = c.req;
  RequestScope& scope = c.scope;
  std::string body = req.body().empty() ? std::string("{}") : req.body();
  const auto set = w.registry.snapshot();
  RequestTrace trace(w.trace_ids, w.spans, w.cfg.trace_sample_ratio, req);
  trace.name("POST " + path);
  auto [status, j] = co_await profile_fan_out(w, *set, std::move(path), std::move(body),
                                              forwarded_headers(w, req, stream, trace), scope);
  trace.finish(scope.client_gone() ? 0 : static_cast<unsigned>(status), "gateway");
  if (scope.client_gone())
    co_return false;
  auto res = json_response(req, status, j);
  co_return co_await write_response(stream, res) && req.keep_alive();
}

}  // namespace

// An io_context whose pending handlers (suspended sessions included) can
// be destroyed before the objects they refer to.
class WorkerIoContext : public net::io_context {
 public:
  explicit WorkerIoContext(int hint) : net::io_context(hint) {}
  using net::io_context::shutdown;
};

struct Gateway::Worker {
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  // Sessions still suspended when the loop stopped (the drain deadline
  // passed) hold references to ctx: destroy them while ctx is alive, not
  // in ~io_context after it.
  ~Worker() { ioc.shutdown(); }
  Worker(Gateway& g, std::size_t index_)
      : index(index_),
        cfg(g.cfg_),
        ctx(cfg, g.registry_, g.make_picker_(index_), ioc.get_executor(), default_authorization(),
            g.active_requests_),
        sweep_timer(ioc) {
    ctx.conversations = g.conversations_->make_handle(ioc.get_executor());
    ctx.conversation_stores = g.conversations_.get();
    ctx.metrics = &g.metrics_;
    ctx.loop_guard = &g.loop_guard_;
    ctx.connector = g.connector_.get();
    ctx.pools.set_answer_budget(&g.answer_budget_);
  }

  std::size_t index;
  // One thread runs it and its sockets are used from that thread only, so
  // the reactor needs no locks (handlers posted from other threads, such as
  // on_ejected's, still go through the scheduler's lock).
  WorkerIoContext ioc{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};
  // This worker's copy of the settings its requests read (ctx.cfg refers
  // to it). A reload replaces it on this thread, between two events, so
  // it is never read while written and needs no lock or atomic.
  Config cfg;
  WorkerContext ctx;
  std::optional<tcp::acceptor> acceptor;
  // Connections this worker accepted and ended: with its requests, what
  // tells its housekeeping the worker went quiet after a burst.
  std::uint64_t connections_seen = 0;
  // The accept loop is paused at --max-connections (logged once per pause).
  bool at_connection_bound = false;
  net::steady_timer sweep_timer;
  std::thread thread;
};

Gateway::Gateway(Config cfg, std::unique_ptr<ConversationStores> conversations,
                 std::shared_ptr<const KvConnector> connector, PickerFactory make_picker,
                 RegistrySyncFactory make_registry_sync, const ClusterIds& ids)
    : cfg_(std::move(cfg)),
      registry_(cfg_, ids),
      make_picker_(std::move(make_picker)),
      make_registry_sync_(std::move(make_registry_sync)),
      conversations_(std::move(conversations)),
      connector_(std::move(connector)) {
  unsigned n = cfg_.workers;
  if (n == 0)
    n = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 0; i < n; ++i)
    workers_.push_back(std::make_unique<Worker>(*this, i));
  build_routes();
}

void Gateway::set_client_keys(std::unique_ptr<ClientKeys> keys, net::any_io_executor control) {
  client_keys_ = std::move(keys);
  for (auto& w : workers_) {
    w->ctx.client_keys = client_keys_.get();
    w->ctx.client_limiter = client_keys_->make_limiter(w->ioc.get_executor());
  }
  client_keys_->start(std::move(control));
}

void Gateway::set_rate_limits(std::unique_ptr<RateLimits> limits) {
  rate_limits_ = std::move(limits);
  for (auto& w : workers_)
    w->ctx.rate_limiter = rate_limits_->make_limiter(w->ioc.get_executor());
  admin_rate_limiter_ = rate_limits_->make_limiter(admin_ioc_.get_executor());
}

Gateway::~Gateway() {
  admin_ioc_.stop();
  if (admin_thread_.joinable())
    admin_thread_.join();
  for (auto& w : workers_) {
    w->ioc.stop();
    if (w->thread.joinable())
      w->thread.join();
  }
}

Result<std::uint16_t> Gateway::bind() {
  beast::error_code ec;
  auto address = net::ip::make_address(cfg_.host, ec);
  if (ec) {
    // A host name: resolved once here, at start-up, never on a worker loop.
    net::io_context tmp;
    tcp::resolver resolver(tmp);
    auto results = resolver.resolve(cfg_.host, std::to_string(cfg_.port), ec);
    if (ec || results.empty())
      return fail("cannot resolve --host " + cfg_.host + ": " + ec.message());
    address = results.begin()->endpoint().address();
  }
  std::uint16_t port = cfg_.port;
  bool first = true;
  for (auto& w : workers_) {
    tcp::endpoint ep(address, port);
    auto& acc = w->acceptor.emplace(w->ioc);
    acc.open(ep.protocol(), ec);
    if (!ec)
      acc.set_option(tcp::acceptor::reuse_address(true), ec);
    // Each worker listens on its own socket so that the kernel spreads
    // connections over them (SO_REUSEPORT). The first binds without the
    // option, then sets it: a port another process holds fails the bind
    // with "address in use", as nginx does, instead of silently sharing
    // that process's traffic; the other workers' sockets then join the
    // first one's group.
    if (!ec && !first)
      acc.set_option(reuse_port(true), ec);
    if (!ec)
      acc.bind(ep, ec);
    if (!ec && first)
      acc.set_option(reuse_port(true), ec);
    if (!ec)
      acc.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return fail("cannot listen on " + cfg_.host + ":" + std::to_string(port) + ": " +
                  ec.message());
    }
    // With --port 0 the first listener picks the port and the others join it.
    port = acc.local_endpoint().port();
    first = false;
  }
  if (auto tls = make_listener_tls(cfg_); !tls) {
    return fail(tls.error());
  } else if (*tls) {
    listener_tls_ = std::make_unique<ListenerTls>(std::move(*tls));
  }
  if (auto tls = make_admin_tls(cfg_); !tls) {
    return fail(tls.error());
  } else if (*tls) {
    admin_tls_ = std::make_unique<ListenerTls>(std::move(*tls));
  }
  auto admin = AdminApi::create(cfg_, registry_, loop_guard_, engine_tls_);
  if (!admin)
    return fail(admin.error());
  admin_ = *admin;
  if (cfg_.access_log != "off") {
    auto log =
        AccessLog::open(cfg_.access_log, cfg_.access_log_format == "json" ? AccessLogFormat::json
                                                                          : AccessLogFormat::text);
    if (!log)
      return fail(log.error());
    access_log_ = std::move(*log);
  }
  if (cfg_.admin_enabled) {
    auto admin_address = net::ip::make_address(cfg_.admin_host, ec);
    if (ec)
      return fail("--admin-host must be an IP address (got " + cfg_.admin_host + ")");
    tcp::endpoint ep(admin_address, cfg_.admin_port);
    auto& acc = admin_acceptor_.emplace(admin_ioc_);
    acc.open(ep.protocol(), ec);
    if (!ec)
      acc.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec)
      acc.bind(ep, ec);
    if (!ec)
      acc.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return fail("cannot listen on admin " + cfg_.admin_host + ":" +
                  std::to_string(cfg_.admin_port) + ": " + ec.message());
    }
    admin_port_ = acc.local_endpoint().port();
  }
  return port;
}

void Gateway::reopen_logs() {
  if (access_log_)
    access_log_->reopen();
}

void Gateway::set_engine_tls(std::shared_ptr<const EngineTls> tls) {
  engine_tls_ = std::move(tls);
  for (auto& w : workers_)
    w->ctx.pools.set_tls(engine_tls_);
}

Result<std::function<void()>> Gateway::prepare_tls_reload() const {
  // Both listeners' files load before either is swapped: a reload applies
  // all of them or none.
  std::shared_ptr<net::ssl::context> client, admin;
  if (listener_tls_) {
    auto ctx = make_listener_tls(cfg_);
    if (!ctx)
      return fail(ctx.error());
    client = std::move(*ctx);
  }
  if (admin_tls_) {
    auto ctx = make_admin_tls(cfg_);
    if (!ctx)
      return fail(ctx.error());
    admin = std::move(*ctx);
  }
  if (!client && !admin)
    return std::function<void()>();
  return std::function<void()>([client_tls = listener_tls_.get(), admin_tls = admin_tls_.get(),
                                client = std::move(client), admin = std::move(admin)]() mutable {
    if (client)
      client_tls->replace(std::move(client));
    if (admin)
      admin_tls->replace(std::move(admin));
  });
}

std::function<net::awaitable<std::pair<unsigned, std::string>>(std::string)>
Gateway::explain_hook() {
  if (!make_dry_picker_)
    return {};
  return [this](std::string document) { return explain(std::move(document)); };
}

net::awaitable<std::pair<unsigned, std::string>> Gateway::explain(std::string document) {
  // Held for the whole call: the dry check of declared limits waits.
  const auto set = registry_.snapshot();
  auto picker = make_dry_picker_(*set);
  if (!picker)
    co_return std::pair<unsigned, std::string>{
        503, "cannot load the policies to explain with: " + picker.error()};
  co_return co_await explain_request(
      document, **picker, {cfg_, *connector_, *set, client_keys_.get(), admin_rate_limiter_.get()});
}

void Gateway::set_policy_hooks(std::function<Result<bool>()> reload,
                               std::function<void(PrometheusText&)> metrics) {
  reload_policy_ = std::move(reload);
  policy_metrics_ = std::move(metrics);
}

nlohmann::json Gateway::status_document(bool addresses) const {
  const auto set = registry_.snapshot();
  nlohmann::json j = {{"prefill_node_count", set->prefill.size()},
                      {"decode_node_count", set->decode.size()},
                      {"prefill_disabled", cfg_.prefill_disabled},
                      {"kv_connector", cfg_.kv_connector},
                      {"workers", workers_.size()},
                      {"active_requests", active_requests_.load()},
                      {"instances",
                       {{"prefill", instances_json(set->prefill, addresses)},
                        {"decode", instances_json(set->decode, addresses)},
                        {"encode", instances_json(set->encode, addresses)},
                        {"draining", instances_json(set->draining, addresses)}}}};
  // The demo proxy's node lists are nothing but addresses.
  if (addresses) {
    j["prefill_nodes"] = host_ports(set->prefill);
    j["decode_nodes"] = host_ports(set->decode);
  }
  return j;
}

void Gateway::apply_config(const Config& before, std::shared_ptr<const Config> next,
                           std::vector<std::string> restart_needed, const ClusterIds& ids) {
  for (const auto& line : reconcile_instances(registry_, before, *next, ids).lines)
    spdlog::info("SIGHUP: {}", line);
  body_budget_.set_limit(next->body_memory_limit);
  answer_budget_.set_limit(next->answer_memory_limit);
  for (auto& wp : workers_) {
    Worker& w = *wp;
    net::post(w.ioc, [&w, next] { w.cfg = *next; });
  }
  if (admin_)
    net::post(admin_ioc_, [admin = admin_, next, keys = std::move(restart_needed)]() mutable {
      admin->set_config(next, std::move(keys));
    });
}

void Gateway::reload_refused(std::string why) {
  if (admin_)
    net::post(admin_ioc_, [admin = admin_, why = std::move(why)]() mutable {
      admin->reload_refused(std::move(why));
    });
}

void Gateway::set_allocator_trim(std::function<void()> trim) {
  trim_allocator_ = std::move(trim);
}

void Gateway::set_span_sink(std::shared_ptr<SpanSink> sink) {
  span_sink_ = std::move(sink);
  for (auto& worker : workers_)
    worker->ctx.spans = span_sink_.get();
}

void Gateway::start() {
  // An ejected instance's requests that have sent nothing to their client
  // yet are cut off on their worker and fail over (or fail) at once,
  // instead of waiting out the first-byte timeout on an engine that hangs.
  registry_.on_ejected = [this](const Instance& inst) {
    for (auto& wp : workers_) {
      Worker& w = *wp;
      net::post(w.ioc, [&w, id = inst.id] { w.ctx.pools.abort_waiting(id); });
    }
  };
  for (auto& wp : workers_) {
    Worker& w = *wp;
    net::co_spawn(w.ioc, accept_loop(w), net::detached);
    net::co_spawn(
        w.ioc,
        [&w, trim = trim_allocator_]() -> net::awaitable<void> {
          std::uint64_t seen = 0, trimmed = 0;
          for (;;) {
            w.sweep_timer.expires_after(kHousekeepingInterval);
            auto [ec] = co_await w.sweep_timer.async_wait(use_tuple);
            if (ec)
              co_return;
            w.ctx.pools.sweep();
            w.ctx.pools.retain(*w.ctx.registry.snapshot());
            // Once per lull: a whole interval without a new request after
            // some. The allocator returns only pages freed longer ago than
            // its delay, and while requests come it does so on its own.
            // Connections count too: a burst of connections that never
            // sent a request (idle TLS handshakes) leaves as much behind.
            const std::uint64_t now_seen = w.ctx.requests_started + w.connections_seen;
            if (trim && now_seen == seen && now_seen != trimmed) {
              trim();
              trimmed = now_seen;
            }
            seen = now_seen;
          }
        },
        net::detached);
    w.thread = std::thread([&w] {
      // A request handler must never take the worker down with an
      // exception; log it and keep serving the other connections.
      for (;;) {
        try {
          w.ioc.run();
          return;
        } catch (const std::exception& e) {
          spdlog::error("worker {}: unexpected exception: {}", w.index, e.what());
        }
      }
    });
  }

  admin_->set_hooks(
      {reload_policy_, [this] { return metrics_text(true); },
       [this] { return status_document(true).dump(); },
       [this] {
         // As the client port's /readyz (the roles a start
         // requires cannot change on reload but encode's).
         const auto set = registry_.snapshot();
         auto [status, j] = readiness(*set, RequiredRoles::from(cfg_), stopping_.load());
         return std::pair{static_cast<unsigned>(status), j.dump()};
       },
       policy_kv_, policy_status_, explain_hook(),
       [this](std::uint64_t id) {
         // Each worker moves its own streams, on its thread.
         for (auto& wp : workers_) {
           Worker& w = *wp;
           net::post(w.ioc, [&w, id] {
             if (const std::size_t n = migrate_streams(w.ctx, id))
               spdlog::info("drain deadline: {} streams from instance {} moved", n, id);
           });
         }
       }});
  if (admin_acceptor_)
    net::co_spawn(admin_ioc_,
                  serve_admin(*admin_acceptor_, admin_, admin_tls_.get(), cfg_.client_idle_timeout),
                  net::detached);
  net::co_spawn(admin_ioc_, run_health_loop(cfg_, registry_, loop_guard_, engine_tls_),
                net::detached);
  if (make_registry_sync_)
    shared_registry_ = make_registry_sync_(cfg_, registry_, loop_guard_);
  if (shared_registry_) {
    if (auto r = shared_registry_->start(admin_ioc_.get_executor()); !r) {
      spdlog::error("shared registry disabled: {}", r.error());
      shared_registry_.reset();
    }
  }
  admin_thread_ = std::thread([this] {
    for (;;) {
      try {
        admin_ioc_.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("admin: unexpected exception: {}", e.what());
      }
    }
  });
}

void Gateway::stop() {
  for (auto& w : workers_)
    w->ioc.stop();
}

void Gateway::wait() {
  for (auto& w : workers_) {
    if (w->thread.joinable())
      w->thread.join();
  }
  admin_ioc_.stop();
  if (admin_thread_.joinable())
    admin_thread_.join();
  spdlog::info("pdgate stopped");
}

void Gateway::begin_drain() {
  stopping_.store(true);
  for (auto& wp : workers_) {
    Worker& w = *wp;
    net::post(w.ioc, [&w] {
      beast::error_code ec;
      if (w.acceptor)
        w.acceptor->close(ec);
    });
  }
}

net::awaitable<void> Gateway::accept_loop(Worker& w) {
  for (;;) {
    // At --max-connections the listener stops accepting: a flood of idle
    // connections waits in the kernel's backlog, costing this process
    // nothing, instead of each getting a session (and, on a TLS listener,
    // a TLS layer). Workers check the shared count on their own, so it may
    // pass the bound by one connection per worker. Polled: a connection
    // that closes on another worker has no way to wake this one.
    if (open_connections_.load(std::memory_order_relaxed) >=
        static_cast<std::int64_t>(w.cfg.max_connections)) {
      if (!w.at_connection_bound) {
        w.at_connection_bound = true;
        metrics_.connection_bound_reached.fetch_add(1, std::memory_order_relaxed);
        spdlog::warn("--max-connections ({}) reached: not accepting until connections close",
                     w.cfg.max_connections);
      }
      net::steady_timer t(w.ioc, std::chrono::milliseconds(10));
      co_await t.async_wait(use_tuple);
      if (!w.acceptor->is_open())
        co_return;
      continue;
    }
    w.at_connection_bound = false;
    tcp::endpoint peer;
    auto [ec, socket] = co_await w.acceptor->async_accept(peer, use_tuple);
    if (ec) {
      if (ec == net::error::operation_aborted || !w.acceptor->is_open())
        co_return;
      // Out of file descriptors and the like: back off instead of spinning.
      spdlog::warn("accept failed: {}", ec.message());
      net::steady_timer t(w.ioc, std::chrono::milliseconds(50));
      co_await t.async_wait(use_tuple);
      continue;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    open_connections_.fetch_add(1, std::memory_order_relaxed);
    ++w.connections_seen;
    net::co_spawn(w.ioc, serve_client(session_env_, w.ctx, std::move(socket), peer),
                  [this, &w](const std::exception_ptr&) {
                    open_connections_.fetch_sub(1, std::memory_order_relaxed);
                    ++w.connections_seen;
                  });
  }
}

namespace {

// Writes an answer computed without I/O.
net::awaitable<bool> respond(ClientRequest& c, http::response<http::string_body> res) {
  co_return co_await write_response(c.client, res) && c.req.keep_alive();
}

}  // namespace

void Gateway::build_routes() {
  using http::verb;
  auto& r = routes_;
  // The generation routes: through prefill and decode.
  const std::pair<const char*, GenerationApi> generation[] = {
      {"/v1/completions", GenerationApi::completions},
      {"/v1/chat/completions", GenerationApi::chat},
      {"/v1/responses", GenerationApi::responses},
  };
  for (const auto& [path, api] : generation) {
    r.add(
        verb::post, path, [api](ClientRequest& c) { return serve_completion(c, api); }, true);
  }
  // vLLM's endpoints one engine answers alone (docs/protocol.md), each
  // forwarded in one hop to a decode instance; counted as the
  // completions are.
  static constexpr std::pair<const char*, ForwardBody> kForwarded[] = {
      {"/tokenize", ForwardBody::json},
      {"/detokenize", ForwardBody::json},
      {"/v1/embeddings", ForwardBody::json},
      {"/pooling", ForwardBody::json},
      {"/classify", ForwardBody::json},
      {"/score", ForwardBody::json},
      {"/v1/score", ForwardBody::json},
      {"/rerank", ForwardBody::json},
      {"/v1/rerank", ForwardBody::json},
      {"/v2/rerank", ForwardBody::json},
      {"/v1/audio/transcriptions", ForwardBody::multipart},
      {"/v1/audio/translations", ForwardBody::multipart},
  };
  for (const auto& [path, body] : kForwarded) {
    r.add(
        verb::post, path, [path, body](ClientRequest& c) { return serve_forwarded(c, path, body); },
        true);
  }
  r.add(verb::get, "/v1/models",
        [](ClientRequest& c) { return serve_forwarded(c, "/v1/models", ForwardBody::none); });
  r.add(verb::get, "/health", [this](ClientRequest& c) {
    const auto set = registry_.snapshot();
    auto [status, j] =
        health_report(*set, RequiredRoles::from(c.w.cfg), stopping_.load(), c.w.cfg.verbose_errors);
    // Redis being down degrades reuse, not serving: it does not make the
    // gateway unhealthy.
    if (c.w.conversation_stores)
      j["conversation_store"] = conversation_store_json(*c.w.conversation_stores);
    return respond(c, json_response(c.req, status, j));
  });
  r.add(verb::get, "/readyz", [this](ClientRequest& c) {
    const auto set = registry_.snapshot();
    auto [status, j] = readiness(*set, RequiredRoles::from(c.w.cfg), stopping_.load());
    return respond(c, json_response(c.req, status, j));
  });
  r.add(verb::get, "/livez", [](ClientRequest& c) {
    return respond(c, json_response(c.req, http::status::ok, {{"status", "alive"}}));
  });
  r.add(verb::get, "/metrics", [this](ClientRequest& c) {
    http::response<http::string_body> res{http::status::ok, c.req.version()};
    res.set(http::field::server, "pdgate");
    res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    res.keep_alive(c.req.keep_alive());
    // Engine addresses as /status shows them: to anyone when no admin key
    // is configured, else only to its holder.
    res.body() = metrics_text(!admin_->authorize_operator(c.req));
    res.prepare_payload();
    return respond(c, std::move(res));
  });
  r.add(verb::get, "/status", [this](ClientRequest& c) {
    // Engine addresses only for whoever may see them: anyone when no admin
    // key is configured (as vLLM's demo proxy has it), else the key holder.
    const bool addresses = !admin_->authorize_operator(c.req);
    return respond(c, json_response(c.req, http::status::ok, status_document(addresses)));
  });
  if (cfg_.profile_routes) {
    for (const char* path : {"/start_profile", "/stop_profile"}) {
      r.add(verb::post, path,
            [this, path](ClientRequest& c) { return serve_profile(c, *admin_, path); });
    }
  }
  // The vLLM demo proxy's endpoint, on the client port as it had it.
  r.add(verb::post, "/instances/add", [this](ClientRequest& c) { return demo_add(c); });
}

net::awaitable<bool> Gateway::demo_add(ClientRequest& c) {
  auto res = co_await admin_->handle_demo_add(c.req);
  co_return co_await write_response(c.client, res) && c.req.keep_alive();
}

}  // namespace pdgate
