// The first phase of every /v1/ request when API keys are configured: who
// the client is (its bearer key), and whether its limits let it in (for a
// completion, once its body is validated: the tokens it may generate are
// reserved). The admission holds the request's concurrency slot and token
// reservation until it is destroyed, at the end of the request, whatever
// way the request ends.
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
  // when the admission ends (and its reservation handed back).
  void add_tokens(std::uint64_t n) { tokens_ += n; }

 private:
  friend bool authenticate(WorkerContext& w,
                           const boost::beast::http::request<boost::beast::http::string_body>& req,
                           ClientAdmission& out, std::optional<GatewayError>& refusal);
  friend boost::asio::awaitable<bool> admit_limits(WorkerContext& w, std::string_view request_id,
                                                   std::uint64_t reserve, ClientAdmission& out,
                                                   std::optional<GatewayError>& refusal);
  ClientLimiter* limiter_ = nullptr;  // set once a slot is held
  ClientKeyPtr key_;
  KeyStats* stats_ = nullptr;  // the key's counts, once authenticated
  std::string slot_;
  std::uint64_t tokens_ = 0;
  std::uint64_t reserved_ = 0;
};

// Who the client is: its bearer key, looked up (no I/O). True when keys
// are off; else false and `refusal` a 401 when the key is missing or
// unknown.
bool authenticate(WorkerContext& w,
                  const boost::beast::http::request<boost::beast::http::string_body>& req,
                  ClientAdmission& out, std::optional<GatewayError>& refusal);

// Whether the authenticated key's limits let the request in, reserving
// `reserve` tokens against its tokens per minute (the prompt estimate and
// max_tokens of a completion; 0 for a request that generates nothing).
// Else false and `refusal` the error to answer with (429 with
// Retry-After, 503 when the shared limiter is down and fails closed).
// True when keys are off or the key has no limits.
boost::asio::awaitable<bool> admit_limits(WorkerContext& w, std::string_view request_id,
                                          std::uint64_t reserve, ClientAdmission& out,
                                          std::optional<GatewayError>& refusal);

// Both, for a request that generates no tokens (reserves none).
boost::asio::awaitable<bool> admit_phase(
    WorkerContext& w, const boost::beast::http::request<boost::beast::http::string_body>& req,
    std::string_view request_id, ClientAdmission& out, std::optional<GatewayError>& refusal);

}  // namespace pdgate
