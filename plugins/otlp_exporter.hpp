// The span sink that exports over OTLP/HTTP (JSON) to --otlp-endpoint.
// Workers hand it finished spans (a short lock, a move into a bounded
// queue); everything else happens on the exporter's own thread and
// io_context: batching, encoding, the HTTP POST with a deadline. A slow
// or dead receiver therefore costs the data path nothing: the queue fills
// and further spans are dropped and counted.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include "core/base/warn_limiter.hpp"
#include "core/config/config.hpp"
#include "core/net/maybe_tls_stream.hpp"
#include "core/net/tls_context.hpp"
#include "core/observability/tracing.hpp"

namespace pdgate {

struct OtlpExporterOptions {
  HttpEndpoint endpoint;  // http:// or https://
  // https://: the collector's certificate is checked against --otlp-ca (or
  // the system's store) and must name the endpoint's host.
  EngineTlsOptions tls;
  std::size_t batch_size = 512;
  std::size_t queue_size = 8192;
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds timeout{5000};  // one export request, connecting included
  std::string service_version;
};

// The options the configuration gives (otlp_endpoint must be set; it was
// validated when the configuration was read).
Result<OtlpExporterOptions> otlp_options(const Config& cfg, std::string service_version);

class OtlpExporter final : public SpanSink {
 public:
  explicit OtlpExporter(OtlpExporterOptions options);
  // Exports what is queued (each request bounded by the timeout), then
  // stops the thread.
  ~OtlpExporter() override;
  OtlpExporter(const OtlpExporter&) = delete;
  OtlpExporter& operator=(const OtlpExporter&) = delete;

  void submit(Span&& span) override;
  SpanStats stats() const override;

 private:
  boost::asio::awaitable<void> run();
  // Sends queued spans, a batch per request, until the queue is empty or
  // a request fails (the rest waits for the next round).
  boost::asio::awaitable<void> export_queued();
  boost::asio::awaitable<bool> post(std::string body);
  // Connects (and shakes hands over https://) within the deadline; false
  // and `why` when it cannot.
  boost::asio::awaitable<bool> connect(std::string& why);
  // The time one export request may take: shorter once shutting down.
  std::chrono::milliseconds deadline() const;

  const OtlpExporterOptions options_;
  mutable std::mutex mu_;
  std::deque<Span> queue_;  // bounded by options_.queue_size
  std::atomic<bool> wake_posted_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> exported_{0};
  std::atomic<std::uint64_t> dropped_full_{0};
  std::atomic<std::uint64_t> dropped_failed_{0};
  WarnLimiter warn_{std::chrono::seconds(10)};

  boost::asio::io_context ioc_{1};
  boost::asio::steady_timer wake_{ioc_};
  // Made when the first https:// export connects.
  EngineTls tls_;
  // A stream never moves (its TLS layer refers to its socket).
  std::unique_ptr<MaybeTlsStream> conn_;
  boost::beast::flat_buffer buffer_;
  std::thread thread_;
};

}  // namespace pdgate
