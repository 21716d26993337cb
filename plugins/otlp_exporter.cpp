#include "plugins/otlp_exporter.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http.hpp>

#include "core/base/clock.hpp"
#include "core/base/use_tuple.hpp"
#include "core/upstream/upstream.hpp"
#include "plugins/otlp_json.hpp"

namespace pdgate {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

// A receiver's answer is a short status document.
constexpr std::uint64_t kMaxAnswer = 1u << 20;
// At shutdown, what is queued gets this long at most per export request,
// so a receiver that hangs cannot hold the process up.
constexpr std::chrono::milliseconds kFinalFlush{1000};

}  // namespace

Result<OtlpExporterOptions> otlp_options(const Config& cfg, std::string service_version) {
  auto endpoint = parse_http_endpoint(cfg.otlp_endpoint, "/v1/traces");
  if (!endpoint)
    return fail("--otlp-endpoint: " + endpoint.error());
  OtlpExporterOptions o;
  o.endpoint = std::move(*endpoint);
  o.tls = EngineTlsOptions::otlp(cfg);
  if (o.endpoint.tls || !cfg.otlp_ca.empty()) {
    // The files load at start (and in --check-config), not at the first
    // export: a CA that does not load is a configuration error.
    if (auto made = make_engine_tls(o.tls); !made)
      return fail(made.error());
  }
  o.batch_size = std::max<std::size_t>(1, cfg.otlp_batch_size);
  o.queue_size = std::max<std::size_t>(1, cfg.otlp_queue_size);
  o.interval = cfg.otlp_export_interval;
  o.timeout = cfg.otlp_timeout;
  o.service_version = std::move(service_version);
  return o;
}

OtlpExporter::OtlpExporter(OtlpExporterOptions options)
    : options_(std::move(options)), tls_(options_.tls) {
  net::co_spawn(ioc_, run(), net::detached);
  thread_ = std::thread([this] { ioc_.run(); });
}

OtlpExporter::~OtlpExporter() {
  stopping_ = true;
  net::post(ioc_, [this] {
    wake_.cancel();
    // An export in flight is cut short (its spans count as failed); the
    // final flush below has its own, shorter deadline.
    if (conn_)
      conn_->close();
  });
  thread_.join();
}

void OtlpExporter::submit(Span&& span) {
  std::size_t queued = 0;
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= options_.queue_size) {
      dropped_full_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queue_.push_back(std::move(span));
    queued = queue_.size();
  }
  // A full batch goes out now rather than at the end of the interval; the
  // wake-up is posted once, not per span.
  if (queued >= options_.batch_size && !wake_posted_.exchange(true))
    net::post(ioc_, [this] { wake_.cancel(); });
}

SpanStats OtlpExporter::stats() const {
  return {exported_.load(std::memory_order_relaxed), dropped_full_.load(std::memory_order_relaxed),
          dropped_failed_.load(std::memory_order_relaxed)};
}

net::awaitable<void> OtlpExporter::run() {
  while (!stopping_) {
    wake_.expires_after(options_.interval);
    co_await wake_.async_wait(use_tuple);
    wake_posted_ = false;
    co_await export_queued();
  }
  // Shutting down: what is left goes out once more.
  co_await export_queued();
  std::lock_guard lock(mu_);
  dropped_failed_.fetch_add(queue_.size(), std::memory_order_relaxed);
  queue_.clear();
}

net::awaitable<void> OtlpExporter::export_queued() {
  for (;;) {
    std::vector<Span> batch;
    {
      std::lock_guard lock(mu_);
      const std::size_t n = std::min(queue_.size(), options_.batch_size);
      batch.reserve(n);
      for (std::size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (batch.empty())
      co_return;
    const bool ok = co_await post(otlp_json(batch, "pdgate", options_.service_version));
    if (ok) {
      exported_.fetch_add(batch.size(), std::memory_order_relaxed);
      continue;
    }
    dropped_failed_.fetch_add(batch.size(), std::memory_order_relaxed);
    // A failing receiver is not asked again before the next round.
    co_return;
  }
}

std::chrono::milliseconds OtlpExporter::deadline() const {
  return stopping_ ? std::min(options_.timeout, kFinalFlush) : options_.timeout;
}

net::awaitable<bool> OtlpExporter::connect(std::string& why) {
  // The resolver has no deadline of its own: a timer cancels it.
  net::ip::tcp::resolver resolver(ioc_);
  net::steady_timer resolve_timer(ioc_, deadline());
  resolve_timer.async_wait([&resolver](beast::error_code ec) {
    if (!ec)
      resolver.cancel();
  });
  auto [rerr, results] = co_await resolver.async_resolve(
      options_.endpoint.host, std::to_string(options_.endpoint.port), use_tuple);
  resolve_timer.cancel();
  if (rerr) {
    why = "cannot resolve " + options_.endpoint.host + ": " + rerr.message();
    co_return false;
  }
  conn_ = std::make_unique<MaybeTlsStream>(ioc_.get_executor());
  // One deadline for connecting and the handshake.
  conn_->expires_after(this->deadline());
  if (auto cerr = co_await connect_stream(conn_->tcp(), results); cerr) {
    conn_.reset();
    why = "cannot connect: " + cerr.message();
    co_return false;
  }
  if (options_.endpoint.tls) {
    auto [herr, cause] = co_await engine_handshake(*conn_, tls_, options_.endpoint.host);
    if (herr) {
      conn_.reset();
      why = "TLS handshake: " + cause;
      co_return false;
    }
  }
  co_return true;
}

net::awaitable<bool> OtlpExporter::post(std::string body) {
  const auto fail_with = [this](std::string_view what) {
    conn_.reset();
    buffer_.clear();
    std::uint64_t held = 0;
    if (warn_.allow(steady_now_ms(), held)) {
      spdlog::warn("OTLP export to {}:{}{} failed: {} ({} more failures not logged)",
                   options_.endpoint.host, options_.endpoint.port, options_.endpoint.target, what,
                   held);
    }
    return false;
  };
  if (std::string why; !conn_ && !co_await connect(why))
    co_return fail_with(why);
  http::request<http::string_body> req{http::verb::post, options_.endpoint.target, 11};
  req.set(http::field::host, options_.endpoint.host + ":" + std::to_string(options_.endpoint.port));
  req.set(http::field::user_agent, "pdgate");
  req.set(http::field::content_type, "application/json");
  req.keep_alive(true);
  req.body() = std::move(body);
  req.prepare_payload();
  // One deadline for the whole exchange.
  conn_->expires_after(deadline());
  auto [werr, written] = co_await http::async_write(*conn_, req, use_tuple);
  (void)written;
  if (werr)
    co_return fail_with(werr.message());
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxAnswer);
  auto [rerr, read] = co_await http::async_read(*conn_, buffer_, parser, use_tuple);
  (void)read;
  if (rerr)
    co_return fail_with(rerr.message());
  const auto& res = parser.get();
  const unsigned status = res.result_int();
  if (!res.keep_alive()) {
    conn_.reset();
    buffer_.clear();
  }
  if (status < 200 || status >= 300)
    co_return fail_with("the receiver answered " + std::to_string(status));
  co_return true;
}

}  // namespace pdgate
