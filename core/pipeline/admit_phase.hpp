// The first phase of every /v1/ request when API keys are configured: who
// the client is (its bearer key) and whether its limits let it in. The
// admission holds the request's concurrency slot until it is destroyed, at
// the end of the request, whatever way the request ends.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http.hpp>

#include "core/net/errors.hpp"
#include "core/pipeline/client_keys.hpp"
#include "core/pipeline/worker.hpp"

namespace pdgate {

class ClientAdmission {
 public:
  ClientAdmission() = default;
  ClientAdmission(const ClientAdmission&) = delete;
  ClientAdmission& operator=(const ClientAdmission&) = delete;
  ~ClientAdmission();

  // The key the request came with (null when keys are off).
  const ClientKey* key() const { return key_.get(); }
  // Tokens the request used, counted against the key's tokens per minute
  // when the admission ends.
  void add_tokens(std::uint64_t n) { tokens_ += n; }

 private:
  friend boost::asio::awaitable<bool> admit_phase(
      WorkerContext& w, const boost::beast::http::request<boost::beast::http::string_body>& req,
      std::string_view request_id, ClientAdmission& out, std::optional<GatewayError>& refusal);
  ClientLimiter* limiter_ = nullptr;  // set once a slot is held
  ClientKeyPtr key_;
  std::string slot_;
  std::uint64_t tokens_ = 0;
};

// Checks the request's key and limits: whether it may go on, else false
// and `refusal` the error to answer with (401, 429 with Retry-After, 503
// when the shared limiter is down and fails closed). True when keys are
// off.
boost::asio::awaitable<bool> admit_phase(
    WorkerContext& w, const boost::beast::http::request<boost::beast::http::string_body>& req,
    std::string_view request_id, ClientAdmission& out, std::optional<GatewayError>& refusal);

}  // namespace pdgate
