#include "core/server.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <cstdio>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include "core/cluster_ops.hpp"
#include "core/conversation.hpp"
#include "core/errors.hpp"
#include "core/health.hpp"
#include "core/http_body.hpp"
#include "core/http_head.hpp"
#include "core/pipeline.hpp"

namespace pdgate {

namespace {

constexpr auto use_tuple = net::as_tuple(net::use_awaitable);
using reuse_port = net::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;
constexpr auto kSweepInterval = std::chrono::seconds(5);

std::string default_authorization() {
  const char* key = std::getenv("OPENAI_API_KEY");
  if (key == nullptr || *key == '\0')
    return {};
  return std::string("Bearer ") + key;
}

// One client request's scope and whether it is over, in one allocation:
// the watch below may outlive the request.
struct WatchedRequest {
  RequestScope scope;
  bool done = false;
  char peek = 0;  // the watch's receive buffer (it must outlive the wait)
};

// Watches the client's socket while its request is being served: the
// client must not send anything until it has its answer, so readability
// means it closed the connection (or pipelined a request, which we leave
// in the socket). On close, every upstream connection of the request is
// closed at once so the engines abort.
//
// The watch is a 1-byte MSG_PEEK receive rather than an async_wait: Asio
// queues a wait with an epoll_ctl that re-arms the descriptor (a system
// call per request), while a receive is queued for free when the last
// read left the socket empty, which is the usual case right after the
// request was read. Peeked bytes stay in the socket for the next read.
void watch_client(tcp::socket& socket, std::shared_ptr<WatchedRequest> req) {
  auto slot = req->scope.watch_cancel().slot();
  auto& peek = req->peek;
  socket.async_receive(
      net::buffer(&peek, 1), tcp::socket::message_peek,
      net::bind_cancellation_slot(slot, [req](const beast::error_code& ec, std::size_t n) {
        // `done` is checked first: once the request completed, the session
        // may already have moved on.
        if (req->done || ec == net::error::operation_aborted)
          return;
        if (!ec && n > 0)
          return;                     // pipelined bytes: the client is still there
        req->scope.on_client_gone();  // end of stream or a reset
      }));
}

nlohmann::json instances_json(const std::vector<InstancePtr>& list) {
  auto arr = nlohmann::json::array();
  for (const auto& i : list) {
    arr.push_back({{"id", i->id},
                   {"url", i->spec.url},
                   {"role", to_string(i->spec.role)},
                   {"healthy", i->healthy.load()},
                   {"in_flight", i->in_flight.load()},
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

// Per-role health of the engines behind the gateway (core/cluster_ops.hpp).
net::awaitable<bool> serve_health(WorkerContext& w, beast::tcp_stream& stream,
                                  const http::request<http::string_body>& req,
                                  RequestScope& scope) {
  // Redis being down degrades reuse, not serving: it does not make the
  // gateway unhealthy.
  nlohmann::json extra = nlohmann::json::object();
  if (w.conversation_stores) {
    extra["conversation_store"] = conversation_store_json(*w.conversation_stores);
  }
  const auto set = w.registry.snapshot();
  auto [status, j] = co_await aggregated_health(w, *set, std::move(extra), scope);
  if (scope.client_gone())
    co_return false;
  auto res = json_response(req, status, j);
  co_return co_await write_response(stream, res) && req.keep_alive();
}

// POST /start_profile, /stop_profile: sent to every instance.
net::awaitable<bool> serve_profile(WorkerContext& w, beast::tcp_stream& stream,
                                   const http::request<http::string_body>& req, RequestScope& scope,
                                   std::string path) {
  std::string authorization = w.default_authorization;
  if (auto it = req.find(http::field::authorization); it != req.end()) {
    authorization = std::string(it->value());
  }
  std::string body = req.body().empty() ? std::string("{}") : req.body();
  const auto set = w.registry.snapshot();
  auto [status, j] = co_await profile_fan_out(w, *set, std::move(path), std::move(body),
                                              std::move(authorization), scope);
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
        ctx(g.cfg_, g.registry_, g.make_picker_(index_), ioc.get_executor(),
            default_authorization(), g.active_requests_),
        sweep_timer(ioc) {
    ctx.conversations = g.conversations_->make_handle(ioc.get_executor());
    ctx.conversation_stores = g.conversations_.get();
    ctx.metrics = &g.metrics_;
  }

  std::size_t index;
  WorkerIoContext ioc{1};
  WorkerContext ctx;
  std::optional<tcp::acceptor> acceptor;
  net::steady_timer sweep_timer;
  std::thread thread;
};

Gateway::Gateway(Config cfg, std::unique_ptr<ConversationStores> conversations,
                 PickerFactory make_picker)
    : cfg_(std::move(cfg)),
      registry_(cfg_),
      make_picker_(std::move(make_picker)),
      conversations_(std::move(conversations)) {
  unsigned n = cfg_.workers;
  if (n == 0)
    n = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 0; i < n; ++i)
    workers_.push_back(std::make_unique<Worker>(*this, i));
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
  for (auto& w : workers_) {
    tcp::endpoint ep(address, port);
    auto& acc = w->acceptor.emplace(w->ioc);
    acc.open(ep.protocol(), ec);
    if (!ec)
      acc.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec)
      acc.set_option(reuse_port(true), ec);
    if (!ec)
      acc.bind(ep, ec);
    if (!ec)
      acc.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return fail("cannot listen on " + cfg_.host + ":" + std::to_string(port) + ": " +
                  ec.message());
    }
    // With --port 0 the first listener picks the port and the others join it.
    port = acc.local_endpoint().port();
  }
  auto admin = AdminApi::create(cfg_, registry_);
  if (!admin)
    return fail(admin.error());
  admin_ = *admin;
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

void Gateway::set_policy_hooks(std::function<Result<bool>()> reload,
                               std::function<std::string()> metrics) {
  reload_policy_ = std::move(reload);
  policy_metrics_ = std::move(metrics);
}

std::string Gateway::status_json() const {
  const auto set = registry_.snapshot();
  nlohmann::json j = {{"prefill_node_count", set->prefill.size()},
                      {"decode_node_count", set->decode.size()},
                      {"prefill_nodes", host_ports(set->prefill)},
                      {"decode_nodes", host_ports(set->decode)},
                      {"prefill_disabled", cfg_.prefill_disabled},
                      {"kv_connector", cfg_.kv_connector},
                      {"workers", workers_.size()},
                      {"active_requests", active_requests_.load()},
                      {"instances",
                       {{"prefill", instances_json(set->prefill)},
                        {"decode", instances_json(set->decode)},
                        {"encode", instances_json(set->encode)},
                        {"draining", instances_json(set->draining)}}}};
  return j.dump();
}

std::string Gateway::metrics_text() const {
  std::string out;
  auto counter = [&out](const std::string& name, const std::string& help) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n";
  };
  auto gauge = [&out](const std::string& name, const std::string& help) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n";
  };
  counter("pdgate_requests_total",
          "Client requests answered, by route, status and the stage that decided it.");
  for (const auto& [key, n] : metrics_.requests()) {
    const auto& [route, status, stage] = key;
    out += "pdgate_requests_total{route=\"" + prometheus_escape(route) + "\",status=\"" +
           std::to_string(status) + "\",stage=\"" + prometheus_escape(stage) + "\"} " +
           std::to_string(n) + "\n";
  }
  metrics_.request_seconds.render(out, "pdgate_request_duration_seconds",
                                  "Time from request read to response end.");
  metrics_.prefill_seconds.render(out, "pdgate_prefill_duration_seconds",
                                  "Time of successful prefill stages.");
  metrics_.decode_ttft_seconds.render(
      out, "pdgate_decode_time_to_first_byte_seconds",
      "Time from sending decode its request to its answer's header.");
  metrics_.overhead_seconds.render(out, "pdgate_gateway_overhead_seconds",
                                   "Time before decode not spent in prefill (parsing, routing, "
                                   "conversation store).");
  gauge("pdgate_in_flight_requests", "Client requests being served.");
  out += "pdgate_in_flight_requests " + std::to_string(active_requests_.load()) + "\n";
  counter("pdgate_retries_total", "Failovers before the first byte, by stage.");
  out += "pdgate_retries_total{stage=\"prefill\"} " +
         std::to_string(metrics_.retries_prefill.load()) + "\n";
  out += "pdgate_retries_total{stage=\"decode\"} " +
         std::to_string(metrics_.retries_decode.load()) + "\n";
  counter("pdgate_retries_refused_total", "Retries not made because the retry budget was spent.");
  out += "pdgate_retries_refused_total " + std::to_string(metrics_.retries_refused.load()) + "\n";
  counter("pdgate_ejections_total", "Instances ejected after consecutive request failures.");
  out += "pdgate_ejections_total " + std::to_string(metrics_.ejections.load()) + "\n";

  const auto set = registry_.snapshot();
  const auto all = set->all();
  auto labels = [](const Instance& i) {
    return "id=\"" + std::to_string(i.id) + "\",url=\"" + prometheus_escape(i.spec.url) +
           "\",role=\"" + to_string(i.spec.role) + "\"";
  };
  gauge("pdgate_instance_in_flight", "Requests this gateway has in flight on each instance.");
  for (const auto& i : all)
    out += "pdgate_instance_in_flight{" + labels(*i) + "} " + std::to_string(i->in_flight.load()) +
           "\n";
  gauge("pdgate_instance_state", "1 for the instance's current state (active, draining, ejected).");
  for (const auto& i : all) {
    for (auto st : {InstanceState::active, InstanceState::draining, InstanceState::ejected}) {
      out += "pdgate_instance_state{" + labels(*i) + ",state=\"" + to_string(st) + "\"} " +
             (i->state() == st ? "1" : "0") + "\n";
    }
  }
  counter("pdgate_instance_requests_total", "Stage requests sent to each instance.");
  for (const auto& i : all)
    out += "pdgate_instance_requests_total{" + labels(*i) + "} " +
           std::to_string(i->requests_total.load()) + "\n";
  counter("pdgate_instance_failures_total", "Stage requests that failed on each instance.");
  for (const auto& i : all)
    out += "pdgate_instance_failures_total{" + labels(*i) + "} " +
           std::to_string(i->failures_total.load()) + "\n";

  if (conversations_) {
    const auto& c = conversations_->counters();
    counter("pdgate_conversation_cache_hits_total", "Turns that found the previous turn's blocks.");
    out += "pdgate_conversation_cache_hits_total " + std::to_string(c.hits.load()) + "\n";
    counter("pdgate_conversation_cache_misses_total",
            "Turns that reused nothing: none stored, another history, no client identity.");
    for (const auto& [reason, n] :
         {std::pair{"none", &c.misses_none}, std::pair{"history", &c.misses_history},
          std::pair{"scope", &c.misses_scope}}) {
      out += std::string("pdgate_conversation_cache_misses_total{reason=\"") + reason + "\"} " +
             std::to_string(n->load()) + "\n";
    }
    counter("pdgate_conversation_cache_errors_total", "Conversation store failures.");
    out += "pdgate_conversation_cache_errors_total " + std::to_string(c.errors.load()) + "\n";
  }
  if (policy_metrics_)
    out += policy_metrics_();
  return out;
}

net::awaitable<void> Gateway::admin_accept_loop() {
  for (;;) {
    auto [ec, socket] = co_await admin_acceptor_->async_accept(use_tuple);
    if (ec) {
      if (ec == net::error::operation_aborted || !admin_acceptor_->is_open())
        co_return;
      net::steady_timer t(admin_ioc_, std::chrono::milliseconds(50));
      co_await t.async_wait(use_tuple);
      continue;
    }
    net::co_spawn(admin_ioc_, admin_session(std::move(socket)), net::detached);
  }
}

net::awaitable<void> Gateway::admin_session(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(64 * 1024);
    parser.body_limit(1u << 20);  // admin bodies are small JSON documents
    stream.expires_after(cfg_.client_idle_timeout);
    auto [ec, n] = co_await http::async_read(stream, buffer, parser, use_tuple);
    if (ec)
      break;
    auto req = parser.release();
    auto res = co_await admin_->handle(req);
    if (!co_await write_response(stream, res) || !req.keep_alive())
      break;
  }
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
}

int Gateway::run() {
  for (auto& wp : workers_) {
    Worker& w = *wp;
    net::co_spawn(w.ioc, accept_loop(w), net::detached);
    std::function<void()> arm_sweep;
    net::co_spawn(
        w.ioc,
        [&w]() -> net::awaitable<void> {
          for (;;) {
            w.sweep_timer.expires_after(kSweepInterval);
            auto [ec] = co_await w.sweep_timer.async_wait(use_tuple);
            if (ec)
              co_return;
            w.ctx.pools.sweep();
            w.ctx.pools.retain(*w.ctx.registry.snapshot());
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
      {reload_policy_, [this] { return metrics_text(); }, [this] { return status_json(); }});
  if (admin_acceptor_)
    net::co_spawn(admin_ioc_, admin_accept_loop(), net::detached);
  net::co_spawn(admin_ioc_, run_health_loop(cfg_, registry_), net::detached);
  if (!cfg_.redis_url.empty()) {
    shared_registry_ = std::make_unique<SharedRegistry>(cfg_, registry_);
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

  net::io_context control;
  net::signal_set signals(control, SIGINT, SIGTERM);
  signals.async_wait([this](const beast::error_code& ec, int sig) {
    if (ec)
      return;
    spdlog::info("signal {}: no longer accepting; draining {} in-flight request(s)", sig,
                 active_requests_.load());
    stop_gracefully();
  });
  net::steady_timer drain(control);
  std::function<void(std::chrono::steady_clock::time_point)> poll =
      [&](std::chrono::steady_clock::time_point deadline) {
        drain.expires_after(std::chrono::milliseconds(50));
        drain.async_wait([&, deadline](const beast::error_code& ec) {
          if (ec)
            return;
          if (!stopping_.load()) {
            poll(deadline);
            return;
          }
          if (active_requests_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
            poll(deadline);
            return;
          }
          if (active_requests_.load() > 0) {
            spdlog::warn("drain deadline passed with {} request(s) in flight",
                         active_requests_.load());
          }
          for (auto& w : workers_)
            w->ioc.stop();
          control.stop();
        });
      };
  // The deadline is taken when the signal arrives; until then the poll
  // only waits for `stopping_`.
  std::function<void()> wait_for_stop = [&] {
    drain.expires_after(std::chrono::milliseconds(50));
    drain.async_wait([&](const beast::error_code& ec) {
      if (ec)
        return;
      if (stopping_.load()) {
        poll(std::chrono::steady_clock::now() + cfg_.shutdown_timeout);
      } else {
        wait_for_stop();
      }
    });
  };
  wait_for_stop();
  control.run();
  for (auto& w : workers_) {
    if (w->thread.joinable())
      w->thread.join();
  }
  admin_ioc_.stop();
  if (admin_thread_.joinable())
    admin_thread_.join();
  spdlog::info("pdgate stopped");
  return 0;
}

void Gateway::stop_gracefully() {
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
    auto [ec, socket] = co_await w.acceptor->async_accept(use_tuple);
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
    net::co_spawn(w.ioc, session(w, std::move(socket)), net::detached);
  }
}

namespace {

// Bodies with more than this still to arrive after the header are read
// straight into the body string.
constexpr std::size_t kDirectBodyRead = 64 * 1024;

// Reads a Content-Length body of `len` bytes into `body` (which the
// parser's reader already reserved), the bytes that came with the header
// first: the kernel copies the rest into place, instead of into the read
// buffer and from there into the body (a 1 MiB memcpy per 1 MiB prompt).
net::awaitable<beast::error_code> read_body_directly(beast::tcp_stream& stream,
                                                     beast::flat_buffer& buffer, std::string& body,
                                                     std::size_t len) {
  body.resize(len);  // zero-fills: far cheaper than the copy it replaces
  const std::size_t have = std::min(buffer.size(), len);
  net::buffer_copy(net::buffer(body.data(), have), buffer.data());
  buffer.consume(have);
  auto [ec, n] =
      co_await net::async_read(stream, net::buffer(body.data() + have, len - have), use_tuple);
  co_return ec;
}

}  // namespace

net::awaitable<bool> Gateway::read_request(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                           http::request<http::string_body>& req) {
  const Config& cfg = cfg_;
  // Answers a request that cannot be read to the end, then closes the way
  // nginx's lingering close does: stop sending, and read (and drop) what
  // the client is still sending for a moment. Closing with unread bytes in
  // the socket would make the kernel send a reset, and the client could
  // lose the answer that explains the refusal.
  auto refuse = [&](unsigned status, std::string message) -> net::awaitable<void> {
    auto res = make_error_response(client_error(status, std::move(message)), 11, false);
    if (!co_await write_response(stream, res))
      co_return;
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream.expires_after(std::chrono::seconds(2));
    std::size_t drained = 0;
    while (drained < cfg.max_body_bytes + (1u << 20)) {
      buffer.clear();
      auto [rec, n] = co_await stream.async_read_some(buffer.prepare(64 * 1024), use_tuple);
      if (rec)
        break;
      drained += n;
    }
  };

  http::request_parser<AppendStringBody> parser;
  parser.header_limit(static_cast<std::uint32_t>(cfg.max_header_bytes));
  parser.body_limit(cfg.max_body_bytes);
  stream.expires_after(cfg.header_timeout);
  if (auto [ec, n] = co_await http::async_read_header(stream, buffer, parser, use_tuple); ec) {
    if (ec == http::error::body_limit) {
      // Beast checks Content-Length against the body limit as soon as the
      // header is complete.
      co_await refuse(413, "request body exceeds the limit of " +
                               std::to_string(cfg.max_body_bytes) + " bytes");
    } else if (ec == http::error::header_limit) {
      co_await refuse(431,
                      "request header exceeds " + std::to_string(cfg.max_header_bytes) + " bytes");
    } else if (ec == beast::error::timeout) {
      // tcp_stream's timeout has closed the socket: as nginx does on its
      // client_header_timeout, the connection ends without an answer.
    } else if (ec != http::error::end_of_stream && ec != net::error::eof &&
               ec != net::error::connection_reset) {
      co_await refuse(400, "malformed HTTP request: " + ec.message());
    }
    co_return false;
  }
  if (auto len = parser.content_length(); len && *len > cfg.max_body_bytes) {
    co_await refuse(413, "request body of " + std::to_string(*len) +
                             " bytes exceeds the limit of " + std::to_string(cfg.max_body_bytes) +
                             " bytes");
    co_return false;
  }
  if (auto it = parser.get().find(http::field::expect);
      it != parser.get().end() && beast::iequals(it->value(), "100-continue")) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    auto [ec, n] = co_await net::async_write(stream, net::buffer(kContinue), use_tuple);
    if (ec)
      co_return false;
  }
  stream.expires_after(cfg.client_idle_timeout);
  beast::error_code body_ec;
  if (const auto len = parser.content_length();
      len && !parser.chunked() && *len > buffer.size() + kDirectBodyRead) {
    body_ec = co_await read_body_directly(stream, buffer, parser.get().body(),
                                          static_cast<std::size_t>(*len));
  } else {
    // Beast reads at most the buffer's free capacity per call: a body
    // read through a 4 KiB buffer costs a system call (and often an epoll
    // wait) per 2-4 KiB. Room is made for it instead; the buffer is shrunk
    // again once the request is read.
    if (len && *len > buffer.capacity() - buffer.size())
      buffer.reserve(buffer.size() + static_cast<std::size_t>(*len));
    auto [ec, n] = co_await http::async_read(stream, buffer, parser, use_tuple);
    body_ec = ec;
  }
  if (const auto ec = body_ec; ec) {
    if (ec == http::error::body_limit) {
      co_await refuse(413, "request body exceeds the limit of " +
                               std::to_string(cfg.max_body_bytes) + " bytes");
    }
    // A timeout (the socket is closed already, as nginx closes on its
    // client_body_timeout), a body cut short or a reset: nothing to answer.
    co_return false;
  }
  stream.expires_never();
  // Moved into the string_body message the handlers take (the body type
  // only changes how it was read).
  req = [&parser] {
    auto parsed = parser.release();
    return http::request<http::string_body>(std::move(parsed.base()), std::move(parsed.body()));
  }();
  co_return true;
}

net::awaitable<bool> Gateway::serve_route(Worker& worker, beast::tcp_stream& stream,
                                          http::request<http::string_body>& req,
                                          RequestScope& scope, std::string_view path) {
  WorkerContext& w = worker.ctx;
  const auto method = req.method();
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    auto res = make_error_response(client_error(405, "use POST for " + std::string(path)),
                                   req.version(), req.keep_alive());
    res.set(http::field::allow, "POST");
    co_return co_await write_response(stream, res) && req.keep_alive();
  } else if (path == "/v1/models" && method == http::verb::get) {
    co_return co_await serve_models(w, stream, req, scope);
  } else if (path == "/health" && method == http::verb::get) {
    co_return co_await serve_health(w, stream, req, scope);
  } else if ((path == "/start_profile" || path == "/stop_profile") && method == http::verb::post) {
    co_return co_await serve_profile(w, stream, req, scope, std::string(path));
  } else if (path == "/status" && method == http::verb::get) {
    auto res = json_response(req, http::status::ok, nlohmann::json::parse(status_json()));
    co_return co_await write_response(stream, res) && req.keep_alive();
  } else if (path == "/metrics" && method == http::verb::get) {
    http::response<http::string_body> res{http::status::ok, req.version()};
    res.set(http::field::server, "pdgate");
    res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    res.keep_alive(req.keep_alive());
    res.body() = metrics_text();
    res.prepare_payload();
    co_return co_await write_response(stream, res) && req.keep_alive();
  } else if (path == "/instances/add" && method == http::verb::post) {
    // The vLLM demo proxy's endpoint, on the client port as it had it.
    auto res = co_await admin_->handle_demo_add(req);
    co_return co_await write_response(stream, res) && req.keep_alive();
  } else {
    auto res =
        make_error_response(client_error(404, "no route for " + std::string(req.method_string()) +
                                                  " " + std::string(path)),
                            req.version(), req.keep_alive());
    co_return co_await write_response(stream, res) && req.keep_alive();
  }
  co_return false;
}

net::awaitable<void> Gateway::session(Worker& worker, tcp::socket socket) {
  WorkerContext& w = worker.ctx;
  const Config& cfg = cfg_;
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  bool first = true;

  while (!stopping_.load(std::memory_order_relaxed)) {
    // Between requests a keep-alive connection may idle; once bytes of a
    // request arrive, the whole header must follow within header_timeout.
    if (buffer.size() == 0) {
      stream.expires_after(first ? cfg.header_timeout : cfg.client_idle_timeout);
      auto [ec, n] = co_await stream.async_read_some(buffer.prepare(4096), use_tuple);
      if (ec)
        break;
      buffer.commit(n);
    }
    first = false;

    // Parsing in its own coroutine: the parser and the refusals take no
    // room in this frame, which lives as long as the connection.
    http::request<http::string_body> req;
    if (!co_await read_request(stream, buffer, req))
      break;
    // The read buffer is empty unless the client pipelined; a streamed
    // answer can last minutes, so it does not keep its 4 KiB+ meanwhile
    // (with 10,000 open streams that is 40 MiB of nothing).
    if (buffer.size() == 0)
      buffer.shrink_to_fit();

    active_requests_.fetch_add(1);
    auto watched = std::make_shared<WatchedRequest>();
    RequestScope* const scope = &watched->scope;
    if (buffer.size() == 0)
      watch_client(stream.socket(), watched);
    bool keep_alive = false;
    const std::string_view path = path_of(req.target());
    const auto method = req.method();
    if ((path == "/v1/completions" || path == "/v1/chat/completions") &&
        method == http::verb::post) {
      keep_alive = co_await serve_completion(w, stream, req, *scope, path != "/v1/completions");
    } else {
      // The other routes in their own frame: their responses would
      // otherwise take room in this one for as long as a stream lasts.
      keep_alive = co_await serve_route(worker, stream, req, *scope, path);
    }
    watched->done = true;
    scope->watch_cancel().emit(net::cancellation_type::all);
    if (path == "/v1/completions" || path == "/v1/chat/completions") {
      // 499 (as nginx logs it): the client left before an answer was written.
      metrics_.count_request(path, scope->status != 0 ? scope->status : 499, scope->stage);
      metrics_.request_seconds.observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - scope->received)
              .count());
    }
    active_requests_.fetch_sub(1);
    if (!keep_alive || scope->client_gone())
      break;
  }
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream.close();
}

}  // namespace pdgate
