#include "core/net/tls_context.hpp"

#include <ctime>

#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace pdgate {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;

namespace {

// Compression (CRIME) and renegotiation (a client-driven CPU cost) are off
// on both sides.
constexpr long kCommonOptions = SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION;

std::string failed(const std::string& what, const std::string& file,
                   const boost::system::error_code& ec) {
  return what + " '" + file + "': " + ec.message();
}

// Loads a certificate chain and its key into `ctx`; empty on success.
std::string load_pair(ssl::context& ctx, const std::string& cert, const std::string& key,
                      const char* cert_flag, const char* key_flag) {
  boost::system::error_code ec;
  ctx.use_certificate_chain_file(cert, ec);
  if (ec)
    return failed(std::string(cert_flag) + ": cannot load the certificate chain", cert, ec);
  ctx.use_private_key_file(key, ssl::context::pem, ec);
  if (ec)
    return failed(std::string(key_flag) + ": cannot load the private key", key, ec);
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
    return std::string(key_flag) + ": the key in '" + key +
           "' does not match the certificate in '" + cert + "'";
  }
  return {};
}

}  // namespace

namespace {

// One server context: the client listener's or the admin listener's,
// `flag` naming the options in messages ("--tls" or "--admin-tls").
Result<std::shared_ptr<ssl::context>> make_server_tls(const std::string& cert,
                                                      const std::string& key,
                                                      const std::string& client_ca,
                                                      unsigned min_version,
                                                      const std::string& flag) {
  if (cert.empty())
    return std::shared_ptr<ssl::context>();
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  SSL_CTX* h = ctx->native_handle();
  SSL_CTX_set_min_proto_version(h, min_version == 13 ? TLS1_3_VERSION : TLS1_2_VERSION);
  // The server's cipher order wins: clients that list weak suites first
  // still get a strong one both support.
  SSL_CTX_set_options(h, kCommonOptions | SSL_OP_CIPHER_SERVER_PREFERENCE);
  const std::string cert_flag = flag + "-cert", key_flag = flag + "-key";
  if (auto err = load_pair(*ctx, cert, key, cert_flag.c_str(), key_flag.c_str()); !err.empty())
    return fail(err);
  if (!client_ca.empty()) {
    boost::system::error_code ec;
    ctx->load_verify_file(client_ca, ec);
    if (ec)
      return fail(failed(flag + "-client-ca: cannot load", client_ca, ec));
    // The CA names are sent in the handshake, so clients holding several
    // certificates pick the right one.
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(client_ca.c_str()))
      SSL_CTX_set_client_CA_list(h, names);
    ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  }
  // Resumed sessions skip the certificate exchange; with client
  // certificates OpenSSL refuses to resume without a context id.
  static constexpr unsigned char kSessionContext[] = "pdgate";
  SSL_CTX_set_session_id_context(h, kSessionContext, sizeof kSessionContext - 1);
  return ctx;
}

}  // namespace

Result<std::shared_ptr<ssl::context>> make_listener_tls(const Config& c) {
  return make_server_tls(c.tls_cert, c.tls_key, c.tls_client_ca, c.tls_min_version, "--tls");
}

Result<std::shared_ptr<ssl::context>> make_admin_tls(const Config& c) {
  return make_server_tls(c.admin_tls_cert, c.admin_tls_key, c.admin_tls_client_ca,
                         c.tls_min_version, "--admin-tls");
}

std::optional<std::int64_t> certificate_not_after(ssl::context& ctx) {
  X509* cert = SSL_CTX_get0_certificate(ctx.native_handle());
  if (cert == nullptr)
    return std::nullopt;
  std::tm tm{};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) != 1)
    return std::nullopt;
  return static_cast<std::int64_t>(timegm(&tm));
}

EngineTlsOptions EngineTlsOptions::from(const Config& c) {
  return {c.upstream_ca, c.upstream_cert, c.upstream_key, c.upstream_insecure};
}

EngineTlsOptions EngineTlsOptions::redis(const Config& c) {
  return {c.redis_tls_ca, c.redis_tls_cert, c.redis_tls_key, false, "--redis-tls"};
}

EngineTlsOptions EngineTlsOptions::otlp(const Config& c) {
  return {c.otlp_ca, "", "", false, "--otlp"};
}

Result<std::shared_ptr<ssl::context>> make_engine_tls(const EngineTlsOptions& c) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  SSL_CTX* h = ctx->native_handle();
  SSL_CTX_set_min_proto_version(h, TLS1_2_VERSION);
  SSL_CTX_set_options(h, kCommonOptions);
  boost::system::error_code ec;
  if (c.ca.empty()) {
    ctx->set_default_verify_paths(ec);
    if (ec)
      return fail("cannot load the system's CA certificates: " + ec.message());
  } else {
    ctx->load_verify_file(c.ca, ec);
    if (ec)
      return fail(failed(c.flag + "-ca: cannot load", c.ca, ec));
  }
  if (!c.cert.empty()) {
    const std::string cert_flag = c.flag + "-cert", key_flag = c.flag + "-key";
    if (auto err = load_pair(*ctx, c.cert, c.key, cert_flag.c_str(), key_flag.c_str());
        !err.empty()) {
      return fail(err);
    }
  }
  ctx->set_verify_mode(c.insecure ? ssl::verify_none : ssl::verify_peer);
  return ctx;
}

ssl::context* EngineTls::context() const {
  std::call_once(made_, [this] {
    auto made = make_engine_tls(options_);
    if (made)
      ctx_ = std::move(*made);
    else
      error_ = made.error();
  });
  return ctx_.get();
}

net::awaitable<std::pair<boost::beast::error_code, std::string>> engine_handshake(
    MaybeTlsStream& stream, const EngineTls& tls, const std::string& host) {
  ssl::context* ctx = tls.context();
  if (ctx == nullptr)
    co_return std::pair{boost::beast::error_code(net::error::operation_not_supported), tls.why()};
  auto& t = stream.start_tls(*ctx);
  SSL* s = t.native_handle();
  boost::system::error_code not_ip;
  (void)net::ip::make_address(host, not_ip);
  if (not_ip)
    SSL_set_tlsext_host_name(s, host.c_str());
  if (tls.verify()) {
    X509_VERIFY_PARAM* param = SSL_get0_param(s);
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if (not_ip)
      X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
    else
      X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());
  }
  auto [ec] =
      co_await t.async_handshake(ssl::stream_base::client, net::as_tuple(net::use_awaitable));
  if (!ec)
    co_return std::pair{ec, std::string()};
  std::string why = ec.message();
  if (const long v = SSL_get_verify_result(s); v != X509_V_OK)
    why = std::string("certificate refused: ") + X509_verify_cert_error_string(v);
  co_return std::pair{ec, why};
}

}  // namespace pdgate
