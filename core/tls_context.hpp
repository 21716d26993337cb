// TLS settings made into OpenSSL contexts: the client listener's
// (--tls-cert, reloaded on SIGHUP) and the one every https:// engine
// connection uses (--upstream-ca, --upstream-cert). Contexts are built on
// the control thread (they read files) and only shared afterwards: an
// SSL_CTX may create connections on many threads at once.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/error.hpp>

#include "core/config.hpp"
#include "core/maybe_tls_stream.hpp"
#include "core/result.hpp"

namespace pdgate {

// The listener's context from --tls-cert/--tls-key (a chain in the cert
// file), --tls-client-ca and --tls-min-version; nullptr when --tls-cert is
// not set. A key that does not match its certificate, or a file that does
// not parse, is an error naming the file.
Result<std::shared_ptr<boost::asio::ssl::context>> make_listener_tls(const Config& c);

// The engines' context: TLS 1.2+, peers verified against --upstream-ca or
// the system store (unless --upstream-insecure), with --upstream-cert and
// --upstream-key presented when set.
Result<std::shared_ptr<boost::asio::ssl::context>> make_engine_tls(const Config& c);

// The listener's current context. Workers take it for each new connection;
// a reload swaps it, and connections already established keep the one they
// were made with (each holds a reference through its SSL object).
class ListenerTls {
 public:
  explicit ListenerTls(std::shared_ptr<boost::asio::ssl::context> ctx) : ctx_(std::move(ctx)) {}
  std::shared_ptr<boost::asio::ssl::context> current() const { return ctx_.load(); }
  void replace(std::shared_ptr<boost::asio::ssl::context> ctx) { ctx_.store(std::move(ctx)); }

 private:
  std::atomic<std::shared_ptr<boost::asio::ssl::context>> ctx_;
};

// How engine connections are secured: the context, and whether names and
// chains are checked (off only with --upstream-insecure).
struct EngineTls {
  std::shared_ptr<boost::asio::ssl::context> ctx;
  bool verify = true;
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
