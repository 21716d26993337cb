#include "core/pipeline/tokenize_phase.hpp"

#include <functional>

#include <spdlog/spdlog.h>

#include "core/base/json_body.hpp"
#include "core/pipeline/engine_call.hpp"
#include "core/routing/tokenize_message.hpp"
#include "core/upstream/upstream.hpp"

namespace pdgate {

namespace {

// A prompt of a million tokens is about 8 MB of ids as JSON text.
constexpr std::size_t kMaxTokenizeAnswer = 16u << 20;

}  // namespace

net::awaitable<void> tokenize_phase(RequestContext& rc) {
  const auto& decode = rc.set->decode;
  if (decode.empty())
    co_return;
  // Read by the validate phase (and moved along with a hook's body edits).
  const std::string_view prompt = rc.pick().prompt_raw;
  if (prompt.empty())
    co_return;
  // Any engine serving the model tokenizes alike: the request id spreads
  // the calls over them without shared state.
  const std::size_t start = std::hash<std::string>{}(rc.request_id()) % decode.size();
  InstancePtr inst;
  for (std::size_t k = 0; k < decode.size() && !inst; ++k) {
    const auto& cand = decode[(start + k) % decode.size()];
    if (cand->healthy.load(std::memory_order_relaxed))
      inst = cand;
  }
  if (!inst)
    co_return;
  StageSpan span = rc.trace.stage("tokenize", inst->spec.url, 0);
  auto up =
      upstream_request(http::verb::post, *inst, "/tokenize",
                       tokenize_body(rc.is_chat, raw_member(rc.body, rc.index, "model"), prompt),
                       rc.request_id(), rc.fwd, span.traceparent());
  const UpstreamTimeouts timeouts{rc.w.cfg.connect_timeout, rc.w.cfg.tokenizer_timeout};
  auto [err, ex] =
      co_await UpstreamExchange::start(rc.w.pools.for_instance(inst), up, rc.scope, timeouts);
  std::string answer;
  UpstreamError rerr = err;
  if (!err) {
    span.status(ex->status());
    rerr = co_await ex->read_all(answer, kMaxTokenizeAnswer);
  }
  std::optional<std::vector<std::uint32_t>> ids;
  if (!rerr && ex->status() == 200)
    ids = parse_tokenize_answer(answer);
  if (!rerr)
    ex->finish();
  if (!ids) {
    span.error("tokenize_failed", "no token ids from " + inst->spec.url);
    span.end();
    spdlog::debug("request {}: /tokenize on {} gave no token ids; routed without exact data",
                  rc.request_id(), inst->spec.url);
    co_return;
  }
  span.end();
  rc.token_ids = std::move(*ids);
  rc.pick().token_ids = &rc.token_ids;
}

}  // namespace pdgate
