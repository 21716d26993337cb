// TLS settings made into OpenSSL contexts: the client listener's
// (--tls-cert, reloaded on SIGHUP) and the one every https:// engine
// connection uses (--upstream-ca, --upstream-cert). Contexts are built on
// the control thread (they read files) and only shared afterwards: an
// SSL_CTX may create connections on many threads at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/error.hpp>

#include "core/base/result.hpp"
#include "core/config/config.hpp"
#include "core/net/maybe_tls_stream.hpp"

namespace pdgate {

// The listener's context from --tls-cert/--tls-key (a chain in the cert
// file), --tls-client-ca and --tls-min-version; nullptr when --tls-cert is
// not set. A key that does not match its certificate, or a file that does
// not parse, is an error naming the file.
Result<std::shared_ptr<boost::asio::ssl::context>> make_listener_tls(const Config& c);
// The admin listener's, from --admin-tls-cert/--admin-tls-key and
// --admin-tls-client-ca (--tls-min-version too); nullptr without
// --admin-tls-cert.
Result<std::shared_ptr<boost::asio::ssl::context>> make_admin_tls(const Config& c);

// What a client context is made from: the engines' (EngineTlsOptions::
// from), and the same kind of context for rediss:// servers and an
// https:// OTLP collector.
struct EngineTlsOptions {
  std::string ca;    // --upstream-ca; empty: the system's store
  std::string cert;  // --upstream-cert and --upstream-key: presented when set
  std::string key;
  bool insecure = false;  // --upstream-insecure
  // The options' common prefix, for messages: "--upstream" names
  // --upstream-ca, --upstream-cert and --upstream-key.
  std::string flag = "--upstream";
  static EngineTlsOptions from(const Config& c);
  // --redis-tls-ca, --redis-tls-cert, --redis-tls-key.
  static EngineTlsOptions redis(const Config& c);
  // --otlp-ca.
  static EngineTlsOptions otlp(const Config& c);
};

// The engines' context: TLS 1.2+, peers verified against the CA file or
// the system store (unless insecure), the client certificate presented
// when set.
Result<std::shared_ptr<boost::asio::ssl::context>> make_engine_tls(const EngineTlsOptions& o);

// The listener's current context. Workers take it for each new connection;
// a reload swaps it, and connections already established keep the one they
// were made with (each holds a reference through its SSL object).
// When the certificate a context presents stops being valid (its
// notAfter), in seconds since the epoch; nullopt without one.
std::optional<std::int64_t> certificate_not_after(boost::asio::ssl::context& ctx);

class ListenerTls {
 public:
  explicit ListenerTls(std::shared_ptr<boost::asio::ssl::context> ctx) : ctx_(std::move(ctx)) {}
  std::shared_ptr<boost::asio::ssl::context> current() const { return ctx_.load(); }
  void replace(std::shared_ptr<boost::asio::ssl::context> ctx) { ctx_.store(std::move(ctx)); }

 private:
  std::atomic<std::shared_ptr<boost::asio::ssl::context>> ctx_;
};

// How engine connections are secured: the context, and whether names and
// chains are checked (off only with --upstream-insecure). The context is
// made when first needed: OpenSSL's tables and the system's CA store cost
// a gateway ~4 MiB of memory, which one whose engines all speak plain HTTP
// never needs. make_now() makes it at start instead, so that a file that
// does not load stops the start (main does so when an engine is https://
// or a TLS file is named).
class EngineTls {
 public:
  explicit EngineTls(EngineTlsOptions options) : options_(std::move(options)) {}
  // The context; null when it cannot be made, why() then says why. Made
  // once, by whichever thread asks first (the others wait for it).
  boost::asio::ssl::context* context() const;
  const std::string& why() const { return error_; }
  bool verify() const { return !options_.insecure; }
  // Makes the context now; its error, empty when made.
  std::string make_now() const { return context() != nullptr ? std::string() : why(); }

 private:
  EngineTlsOptions options_;
  mutable std::once_flag made_;
  mutable std::shared_ptr<boost::asio::ssl::context> ctx_;
  mutable std::string error_;
};

// Turns a connected stream to `host` into TLS and shakes hands within the
// stream's current expiry: SNI is `host` (unless it is an IP address, which
// SNI cannot carry), and the certificate must name `host` (a DNS name or an
// IP address) when tls.verify. On failure, the error and a text naming
// the cause (OpenSSL's verification result when a certificate was refused:
// "unable to get local issuer certificate", "hostname mismatch").
boost::asio::awaitable<std::pair<boost::beast::error_code, std::string>> engine_handshake(
    MaybeTlsStream& stream, const EngineTls& tls, const std::string& host);

}  // namespace pdgate
