// A generation request's life in the simulated engine (generation.hpp):
// validate -> faults -> admission (FIFO queue bounded by --max-num-seqs) ->
// KV pull (decode side, or a prefill handed the decode's blocks) ->
// prefix-cache lookup -> prefill (one of --prefill-lanes) -> one decode step
// per output token -> issue kv params -> final answer.
#include "sim/generation.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/system/system_error.hpp>
#include <ctime>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "sim/generation_request.hpp"
#include "sim/responses.hpp"
#include "sim/responses_api.hpp"
#include "sim/tokenizer.hpp"

namespace pdgate::sim {

Generator::Generator(const SimOptions& opts, spdlog::logger& log, Counters& counters,
                     Faults& faults, KvTransfer& kv, PrefixCache& cache, CacheEvents& cache_events)
    : opts_(opts),
      log_(log),
      counters_(counters),
      faults_(faults),
      kv_(kv),
      cache_(cache),
      cache_events_(cache_events),
      latency_{opts.prefill_base_ms, opts.prefill_us_per_token, opts.itl_ms, opts.kv_pull_ms},
      scheduler_(opts.max_num_seqs, opts.max_waiting),
      prefill_lanes_(opts.prefill_lanes, std::numeric_limits<std::size_t>::max()) {}

awaitable<void> Generator::generate(Exchange& x, SimApi api) {
  bool failed = false;
  try {
    co_await generate_inner(x, api);
  } catch (const boost::system::system_error& e) {
    // Cancellation (client gone) surfaces as operation_aborted.
    if (e.code() != net::error::operation_aborted) {
      log_.error("request {} failed: {}", x.rid, e.what());
      failed = true;
    }
  } catch (const std::exception& e) {
    log_.error("request {} failed: {}", x.rid, e.what());
    failed = true;
  }
  if (failed && !x.response_started && !x.client_gone) {
    std::string msg = "internal error in pdgate-sim";
    co_await send_error(x, 500, std::move(msg));
  }
}

awaitable<void> Generator::generate_inner(Exchange& x, SimApi api) {
  const bool chat = api == SimApi::chat;
  RequestRecord& rec = *x.rec;
  GenRequest g;
  if (std::optional<HttpError> err = parse_generation(x.req, api, opts_, counters_, log_, rec, g)) {
    co_await send_error(x, err->code, err->message);
    co_return;
  }
  const std::size_t prompt_tokens = g.prompt.tokens;
  const bool kv_capable = opts_.role != SimRole::encode;

  // Faults fire before any work is done.
  if (!co_await faults_.before_work(x, g.fault, g.stream))
    co_return;

  if (scheduler_.would_reject()) {
    ++counters_.requests_rejected;
    const std::string msg = "The engine's waiting queue is full (" +
                            std::to_string(opts_.max_waiting) + " requests waiting).";
    co_await send_error(x, 503, msg);
    co_return;
  }

  ResponseMeta meta{(chat ? "chatcmpl-" : "cmpl-") + x.rid, opts_.model,
                    static_cast<std::int64_t>(std::time(nullptr)), chat};
  // /v1/responses: its answer and events (sim/responses_api.hpp).
  std::optional<ResponsesAnswer> responses;
  if (api == SimApi::responses)
    responses.emplace(x.rid, opts_.model, meta.created, g.body, g.max_tokens);
  // Mooncake: a decode leg waits for prefill's KV (sent at the same time)
  // before it answers anything, and fails when it never comes.
  std::optional<KvTransfer::Received> waited;
  if (!g.transfer_id.empty() && g.remote_prefill) {
    waited = co_await kv_.receive(g, x.rid, rec);
    if (waited->failure) {
      co_await send_error(x, 500, *waited->failure);
      co_return;
    }
  }
  // Like vLLM (a StreamingResponse), streaming headers go out as soon as
  // the request is accepted, before it is scheduled.
  if (g.stream) {
    if (!co_await write_stream_headers(x))
      co_return;
    if (responses) {
      std::string events = responses->start_events();
      if (!co_await write_event(x, std::move(events)))
        co_return;
    }
  }

  Scheduler::Slot slot = co_await scheduler_.acquire();
  if (!slot)
    co_return;  // cancelled while queued
  const std::size_t bs = cache_.block_size();
  BlockHold hold(active_blocks_);
  hold.set((prompt_tokens + bs - 1) / bs);

  // KV transfer.
  const KvTransfer::Received received = waited ? *waited : co_await kv_.receive(g, x.rid, rec);
  const bool skip_prefill = received.skip_prefill;

  // Prefix cache, then prefill.
  const auto hashes = cache_.block_hashes(g.prompt.text, g.lora);
  const std::size_t local_cached = cached_prefix_tokens(cache_.match(hashes), bs, prompt_tokens);
  counters_.prefix_cache_queries += prompt_tokens;
  counters_.prefix_cache_hits += local_cached;
  counters_.prompt_tokens += prompt_tokens;
  std::size_t cached = std::max(local_cached, received.remote_cached);
  if (skip_prefill) {
    cached = prompt_tokens;
    const auto pull = latency_.pull();
    if (!co_await sleep_for(pull))
      co_return;
  } else {
    Scheduler::Slot lane = co_await prefill_lanes_.acquire();
    if (!lane)
      co_return;
    const auto prefill = latency_.prefill(prompt_tokens - cached);
    if (!co_await sleep_for(prefill))
      co_return;
  }
  rec.cached_tokens = cached;
  // Blocks computed here or pulled from a prefill are cached, as vLLM
  // caches a request's full blocks once their KV is in place.
  cache_events_.insert(g.prompt.text, hashes, g.lora);

  ojson issued = nullptr;
  if (g.remote_decode && !g.transfer_id.empty()) {
    // Mooncake: the blocks go to the decode leg waiting under the
    // transfer id; prefill answers no params.
    kv_.publish(g.transfer_id, g.prompt.text, prompt_tokens);
  } else if (g.remote_decode) {
    issued = kv_.issue(x.rid, g.prompt.text, prompt_tokens, true);
  }

  // Decode. The prefill produced the first token; a decode that received
  // the KV from elsewhere runs one step for it.
  std::string text;
  const auto itl = latency_.itl();
  for (std::size_t i = 0; i < g.max_tokens; ++i) {
    if (i > 0 || skip_prefill) {
      if (!co_await sleep_for(itl))
        co_return;
    }
    const std::string token = output_token(g.first_token + i);
    text += token;
    rec.completion_tokens = i + 1;
    ++counters_.generation_tokens;
    hold.set((prompt_tokens + i + 1 + bs - 1) / bs);
    const bool last = i + 1 == g.max_tokens;
    if (last && !g.remote_decode && opts_.issue_decode_kv && kv_capable) {
      // The conversation so far (prompt + this answer) stays on this
      // engine for the next turn's prefill to pull.
      const std::string conv = g.prompt.text + (chat ? "assistant" : "") + text;
      issued = kv_.issue(x.rid, conv, tokens_for_bytes(conv.size()), false);
    }
    if (!g.stream)
      continue;
    if (responses) {
      std::string event = responses->delta_event(token);
      if (!co_await write_event(x, std::move(event)))
        co_return;
      continue;
    }
    if (i == 0 && chat) {
      ojson role = make_role_chunk(meta);
      // return_token_ids: the prompt's ids come in the first chunk.
      if (g.return_token_ids)
        role["prompt_token_ids"] = token_ids(g.prompt.text);
      std::string role_event = sse_event(role);
      if (!co_await write_event(x, std::move(role_event)))
        co_return;
    }
    ojson chunk = make_token_chunk(meta, token, last ? "length" : "");
    if (g.return_token_ids) {
      ojson& choice = chunk["choices"][0];
      if (i == 0 && !chat)
        choice["prompt_token_ids"] = token_ids(g.prompt.text);
      choice["token_ids"] = ojson::array({output_token_id(g.first_token + i)});
    }
    // kv params ride on the last data event before [DONE].
    if (last && !g.include_usage && !issued.is_null())
      chunk["kv_transfer_params"] = issued;
    std::string event = sse_event(chunk);
    if (!co_await write_event(x, std::move(event)))
      co_return;
  }
  rec.kv_params_issued = !issued.is_null();
  const Usage usage{prompt_tokens, g.max_tokens,
                    opts_.enable_prompt_tokens_details ? rec.cached_tokens : 0};
  ++counters_.requests_completed;
  if (responses) {
    if (g.stream) {
      std::string events = responses->finish_events(text, usage, cached, issued);
      if (!co_await write_event(x, std::move(events)))
        co_return;
      co_await end_stream(x);
      co_return;
    }
    std::string body = dump(responses->whole(text, usage, cached, issued));
    co_await reply(x, http::status::ok, std::move(body), "application/json");
    co_return;
  }
  if (g.stream) {
    if (g.include_usage) {
      ojson chunk = make_usage_chunk(meta, usage);
      if (!issued.is_null())
        chunk["kv_transfer_params"] = issued;
      std::string event = sse_event(chunk);
      if (!co_await write_event(x, std::move(event)))
        co_return;
    }
    std::string done(kSseDone);
    if (!co_await write_event(x, std::move(done)))
      co_return;
    co_await end_stream(x);
    co_return;
  }
  ojson answer = make_response(meta, text, "length", usage, issued);
  if (g.return_token_ids) {
    ojson ids = ojson::array();
    for (std::size_t i = 0; i < g.max_tokens; ++i)
      ids.push_back(output_token_id(g.first_token + i));
    answer["choices"][0]["token_ids"] = std::move(ids);
    if (chat)
      answer["prompt_token_ids"] = token_ids(g.prompt.text);
    else
      answer["choices"][0]["prompt_token_ids"] = token_ids(g.prompt.text);
  }
  // Only an engine that computed the prompt has its logprobs: a decode
  // that received the KV answers null, as vLLM's can give nothing else.
  if (g.prompt_logprobs && !skip_prefill) {
    ojson lp = make_prompt_logprobs(g.prompt.text);
    if (chat)
      answer["prompt_logprobs"] = std::move(lp);
    else
      answer["choices"][0]["prompt_logprobs"] = std::move(lp);
  }
  std::string body = dump(answer);
  co_await reply(x, http::status::ok, std::move(body), "application/json");
}

}  // namespace pdgate::sim
