#include "core/pipeline/admit_phase.hpp"

#include <spdlog/spdlog.h>

namespace pdgate {

namespace http = boost::beast::http;

namespace {

void count(std::atomic<std::uint64_t>& c) {
  c.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

ClientAdmission::~ClientAdmission() {
  if (stats_ != nullptr && tokens_ > 0)
    stats_->tokens.fetch_add(tokens_, std::memory_order_relaxed);
  if (limiter_ != nullptr && key_)
    limiter_->release(*key_, slot_, tokens_, reserved_);
}

bool authenticate(WorkerContext& w, const http::request<http::string_body>& req,
                  ClientAdmission& out, std::optional<GatewayError>& refusal) {
  if (w.client_keys == nullptr)
    return true;
  ClientKeys& keys = *w.client_keys;
  const auto auth = req.find(http::field::authorization);
  const std::string_view presented =
      auth == req.end() ? std::string_view{} : bearer_token(auth->value());
  out.key_ = keys.find(presented);
  if (out.key_) {
    out.stats_ = &keys.stats_for(*out.key_);
    return true;
  }
  count(keys.counters().unauthenticated);
  refusal = client_error(ErrorKind::unauthenticated,
                         presented.empty() ? "You didn't provide an API key: send it as "
                                             "'Authorization: Bearer YOUR_KEY'"
                                           : "Incorrect API key provided");
  return false;
}

boost::asio::awaitable<bool> admit_limits(WorkerContext& w, std::string_view request_id,
                                          std::uint64_t reserve, ClientAdmission& out,
                                          std::optional<GatewayError>& refusal) {
  if (w.client_keys == nullptr || !out.key_)
    co_return true;
  ClientKeys& keys = *w.client_keys;
  auto& c = keys.counters();
  KeyStats& k = *out.stats_;
  if (!out.key_->limits.any() || !w.client_limiter) {
    count(c.admitted);
    count(k.admitted);
    co_return true;
  }
  Admission a = co_await w.client_limiter->admit(*out.key_, request_id, reserve);
  switch (a.verdict) {
    case Admission::Verdict::admitted:
      count(c.admitted);
      count(k.admitted);
      out.limiter_ = w.client_limiter.get();
      out.slot_ = std::move(a.slot);
      out.reserved_ = reserve;
      co_return true;
    case Admission::Verdict::limited: {
      count(a.reason == "rate"          ? c.limited_rate
            : a.reason == "concurrency" ? c.limited_concurrency
                                        : c.limited_tokens);
      count(a.reason == "rate"          ? k.limited_rate
            : a.reason == "concurrency" ? k.limited_concurrency
                                        : k.limited_tokens);
      const char* what = a.reason == "rate"          ? "requests per second"
                         : a.reason == "concurrency" ? "concurrent requests"
                                                     : "tokens per minute";
      GatewayError e =
          client_error(ErrorKind::rate_limited,
                       "Rate limit reached for API key '" + out.key_->name + "' (" + what + ")");
      // Whole seconds, rounded up: coming back early only earns another 429.
      e.retry_after_seconds =
          static_cast<unsigned>(std::max<std::int64_t>(1, (a.retry_after.count() + 999) / 1000));
      refusal = std::move(e);
      co_return false;
    }
    case Admission::Verdict::unavailable:
      count(c.limiter_unavailable);
      count(k.limiter_unavailable);
      if (keys.fail_open()) {
        spdlog::debug("request {}: limiter unavailable ({}); admitted (fail open)", request_id,
                      a.reason);
        co_return true;
      }
      refusal = gateway_error(ErrorKind::limiter_unavailable,
                              "rate limiter unavailable; try again shortly", a.reason);
      co_return false;
  }
  co_return true;
}

boost::asio::awaitable<bool> admit_phase(WorkerContext& w,
                                         const http::request<http::string_body>& req,
                                         std::string_view request_id, ClientAdmission& out,
                                         std::optional<GatewayError>& refusal) {
  if (!authenticate(w, req, out, refusal))
    co_return false;
  co_return co_await admit_limits(w, request_id, 0, out, refusal);
}

}  // namespace pdgate
