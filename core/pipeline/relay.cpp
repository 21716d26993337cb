#include "core/pipeline/relay.hpp"

#include "core/pipeline/prompt_logprobs.hpp"

#include <charconv>

#include <spdlog/spdlog.h>

#include "core/net/chunk_framing.hpp"
#include "core/net/http_head.hpp"
#include "core/net/response_writer.hpp"
#include "core/observability/usage.hpp"
#include "core/pipeline/engine_call.hpp"
#include "core/pipeline/engine_errors.hpp"
#include "core/pipeline/failover.hpp"

namespace pdgate {

namespace {

// Writes one piece of the relayed stream as an HTTP chunk; with `last`,
// the stream's end (the zero-size chunk) leaves in the same write, so a
// stream whose last events and end arrive together costs one system call.
net::awaitable<bool> write_chunk(MaybeTlsStream& client, std::string_view data, const Config& cfg,
                                 bool last = false) {
  client.expires_after(cfg.client_idle_timeout);
  const ChunkFraming piece({}, data, last);
  beast::error_code ec;
  if (auto rest = client.write(piece.buffers(), ec))
    ec = co_await std::move(*rest);
  co_return !ec;
}

// The head of decode's answer as the client gets it, written directly:
// only the status, the engine's Content-Type and Cache-Control (what
// describes the body; hop-by-hop and framing headers belong to the
// upstream connection), the request id and the framing (`framing`: a
// "Transfer-Encoding: chunked" or "Content-Length: N" line).
std::string answer_head(const http::request<http::string_body>& req, const UpstreamExchange& ex,
                        const std::string& request_id, std::string_view default_type,
                        std::string_view framing) {
  char digits[8];
  const std::string_view status(
      digits, static_cast<std::size_t>(
                  std::to_chars(digits, digits + sizeof digits, ex.status()).ptr - digits));
  const std::string_view type =
      ex.content_type().empty() ? default_type : std::string_view(ex.content_type());
  const std::string_view cache_control = ex.cache_control();
  const bool http10 = req.version() == 10;
  const bool keep_alive = req.keep_alive();
  return assemble_head([&](auto&& put) {
    put(http10 ? "HTTP/1.0 " : "HTTP/1.1 ");
    put(status);
    put(" ");
    put(http::obsolete_reason(static_cast<http::status>(ex.status())));
    put("\r\nServer: pdgate\r\n");
    if (!type.empty()) {
      put("Content-Type: ");
      put(type);
      put("\r\n");
    }
    if (!cache_control.empty()) {
      put("Cache-Control: ");
      put(cache_control);
      put("\r\n");
    }
    put("X-Request-Id: ");
    put(request_id);
    put("\r\n");
    put(framing);
    put("\r\n");
    if (!keep_alive)
      put("Connection: close\r\n");
    else if (http10)
      put("Connection: keep-alive\r\n");
    put("\r\n");
  });
}

// Answers that carry no body by definition (RFC 9110 6.4.1).
bool carries_no_body(unsigned status) {
  return status < 200 || status == 204 || status == 304;
}

// The head of a whole answer with a body, rendered directly: a Beast
// message allocated each of its fields first.
std::string whole_answer_head(const http::request<http::string_body>& req,
                              const UpstreamExchange& ex, const std::string& request_id,
                              std::size_t body_size) {
  char framing[48] = "Content-Length: ";
  char* const digits = framing + 16;
  const char* const framing_end = std::to_chars(digits, framing + sizeof framing, body_size).ptr;
  return answer_head(req, ex, request_id, {}, std::string_view(framing, framing_end - framing));
}

// The stream's response head and its first events, in one write; with
// the last chunk too when the stream already ended (a short answer is one
// write). Its own coroutine, so that the head is gone while the stream
// relays (and idles).
net::awaitable<bool> write_stream_start(const Config& cfg, MaybeTlsStream& client,
                                        const http::request<http::string_body>& req,
                                        UpstreamExchange& ex, const std::string& request_id,
                                        std::string_view first, bool last) {
  const std::string head =
      answer_head(req, ex, request_id, "text/event-stream", "Transfer-Encoding: chunked");
  client.expires_after(cfg.client_idle_timeout);
  const ChunkFraming piece(head, first, last);
  beast::error_code ec;
  if (auto rest = client.write(piece.buffers(), ec))
    ec = co_await std::move(*rest);
  co_return !ec;
}

// A turn of a named conversation ended without decode handing out
// kv_transfer_params: the next turn will recompute the whole history.
// Counted, and said now and then: the usual cause is decode engines not
// set up to issue them (vLLM's bidirectional KV transfer; pdgate-sim
// --issue-decode-kv), which nothing else would reveal.
void note_turn_without_params(WorkerContext& w, const DecodeRelay& r, bool captured) {
  if (captured || !r.conversation || w.conversation_stores == nullptr)
    return;
  auto& c = w.conversation_stores->counters();
  c.add(c.turns_without_params);
  std::uint64_t held_back = 0;
  if (c.without_params_warnings.allow(steady_now_ms(), held_back)) {
    spdlog::warn(
        "request {}: decode {} answered a conversation turn without kv_transfer_params, so the "
        "next turn cannot reuse its KV cache; are the decode engines configured to issue them? "
        "({} more since the last warning)",
        r.view->request_id, r.decode->spec.url, held_back);
  }
}

// The engine's token counts, wherever the relay ends: on the decode
// instance's counters and in the request's record.
void note_usage(const DecodeRelay& r, const std::optional<TokenUsage>& usage,
                RequestOutcome& outcome) {
  if (!usage)
    return;
  r.decode->latency.add_usage(*usage);
  outcome.tokens_used = usage->prompt_tokens + usage->completion_tokens;
  if (outcome.record)
    outcome.record->usage = usage;
}

// Decode broke off mid-stream: noted against the instance and the trace;
// returns the in-band error event the client gets. (Not in the relay's
// coroutine: its strings would take room in every idle stream's frame.)
std::string broken_stream_event(const WorkerContext& w, const UpstreamError& failure) {
  const std::string why = w.cfg.verbose_errors ? failure.detail : public_reason(failure.kind);
  return sse_data_event(error_json(502, "decode stage failed mid-stream: " + why));
}
std::string broke_off(WorkerContext& w, DecodeRelay& r, const UpstreamError& failure) {
  note_broken(w, r, failure);
  return broken_stream_event(w, failure);
}

// Shows the resumption the bytes about to go to the client: a resumed
// leg's events are rewritten into the stream's, and the transcript reads
// them. Returns false when an error event came: `bytes` then holds only
// what precedes it. `cut`: whether the error event may be kept from the
// client (not when it is all a first read brought).
bool pass_resume(StreamResume* rs, std::string& bytes, bool cut = true) {
  if (rs == nullptr)
    return true;
  if (rs->leg)
    bytes = rs->leg->rewrite(bytes);
  const std::size_t keep = rs->transcript.observe(bytes, rs->strip_ids);
  if (keep == bytes.size() || (!cut && keep == 0))
    return true;
  bytes.resize(keep);
  return false;
}

// Why `failure` broke a stream.
BreakReason reason_of(const UpstreamError& failure) {
  return failure.kind == UpstreamFailure::timeout ? BreakReason::stall : BreakReason::reset;
}

// The rest of decode's stream after its first events went out with the
// header. If decode breaks off now, the client gets an in-band error event
// and the stream ends: never an invented finish_reason or [DONE]. With a
// resumption (`rs`), the relay stops instead and leaves the stream open.
net::awaitable<bool> relay_stream(ClientRequest& c, DecodeRelay& r, StreamResume* rs) {
  WorkerContext& w = c.w;
  MaybeTlsStream& client = c.client;
  const http::request<http::string_body>& req = c.req;
  UpstreamExchange& ex = *r.ex;
  // Counted however the relay ends (the client may leave mid-stream); a
  // resumed leg's usage is the sum the client was told.
  struct CountUsage {
    const DecodeRelay& r;
    RequestOutcome& outcome;
    const StreamResume* rs;
    ~CountUsage() {
      note_usage(r, rs && rs->leg && rs->leg->usage() ? rs->leg->usage() : r.stream->usage(),
                 outcome);
    }
  } count_usage{r, c.outcome, rs};
  const bool resumed = rs != nullptr && rs->leg.has_value();
  // Between legs nothing may cut this one off (migrate_streams()).
  struct Current {
    StreamResume* rs;
    ~Current() {
      if (rs)
        rs->current = nullptr;
    }
  } current{rs};
  if (rs)
    rs->current = &r;
  bool broke = !pass_resume(rs, r.first, resumed);
  // A short answer may have ended with its first read: then everything,
  // the last chunk included, leaves in that one write.
  const bool ended = r.stream->done() && !broke;
  // (Not a conditional expression: GCC 12 runs both co_awaits of one.)
  bool written = false;
  if (resumed)
    written = co_await write_chunk(client, r.first, w.cfg, ended);
  else
    written =
        co_await write_stream_start(w.cfg, client, req, ex, r.view->request_id, r.first, ended);
  if (!written) {
    c.scope.on_client_gone();
    co_return false;
  }
  c.outcome.count_sent(r.first.size());
  if (ended) {
    note_turn_without_params(w, r, r.stream->captured_params());
    ex.finish();
    if (rs)
      rs->broke.reset();  // a drain's cut that came too late: nothing to resume
    co_return req.keep_alive();
  }
  // Bytes reached the client: no failover from here on.
  ex.committed();
  // The engine's header fields are no longer needed (status and framing
  // are kept by the parser).
  ex.drop_header_fields();
  std::string().swap(r.first);
  std::string out;
  UpstreamError failure;
  while (!broke && !r.stream->done()) {
    // An idle stream waits here, its read's frames not yet allocated and
    // its read buffer released.
    if (ex.must_wait()) {
      if (auto err = co_await ex.wait_bytes(); err) {
        if (err.kind == UpstreamFailure::aborted)
          co_return false;
        failure = std::move(err);
        break;
      }
    }
    if (auto err = co_await r.stream->read_into(out); err) {
      if (err.kind == UpstreamFailure::aborted)
        co_return false;
      failure = std::move(err);
      break;
    }
    broke = !pass_resume(rs, out);
    const bool last = r.stream->done() && !broke;
    if (last) {
      note_turn_without_params(w, r, r.stream->captured_params());
      ex.finish();
    }
    if (!out.empty() || last) {
      if (!co_await write_chunk(client, out, w.cfg, last)) {
        c.scope.on_client_gone();
        co_return false;
      }
      c.outcome.count_sent(out.size());
    }
    if (last) {
      if (rs)
        rs->broke.reset();
      co_return req.keep_alive();
    }
    std::string().swap(out);
  }
  if (broke) {
    failure = UpstreamError{UpstreamFailure::protocol,
                            "decode " + r.decode->spec.url + " sent an error event mid-stream"};
    if (rs)
      rs->reason = BreakReason::error_event;
  } else if (rs && rs->broke) {
    // Cut off on purpose (a drain's deadline): the reason is set.
    failure = std::move(*rs->broke);
  } else if (rs) {
    rs->reason = reason_of(failure);
  }
  if (rs) {
    rs->broke = std::move(failure);
    co_return req.keep_alive();
  }
  // Not resumable (--decode-migrations 0, a Responses stream): counted
  // as a break not tried.
  count_migration(w, reason_of(failure), MigrationOutcome::refused);
  const std::string ev = broke_off(w, r, failure);
  if (!co_await write_chunk(client, ev, w.cfg, true))
    co_return false;
  c.outcome.count_sent(ev.size());
  co_return req.keep_alive();
}

// A whole decode answer, through the filter (its own frame, so the filter
// takes no room in the caller's while a stream relays).
net::awaitable<bool> relay_whole(ClientRequest& c, DecodeRelay& r) {
  WorkerContext& w = c.w;
  MaybeTlsStream& client = c.client;
  const http::request<http::string_body>& req = c.req;
  r.ex->committed();
  DecodeOutputFilter filter(r.decode->spec.host, w.cfg.expose_kv_params,
                            r.conversation ? &r.conversation->recorder : nullptr);
  if (r.cached_tokens && r.ex->status() >= 200 && r.ex->status() < 300) {
    if (auto merged = with_cached_tokens(r.first, *r.cached_tokens))
      r.first = std::move(*merged);
  }
  if (r.prompt_logprobs && r.ex->status() >= 200 && r.ex->status() < 300) {
    if (auto merged = with_prompt_logprobs(r.first, *r.prompt_logprobs))
      r.first = std::move(*merged);
  }
  filter.on_body(r.first);
  note_usage(r, last_usage(r.first), c.outcome);
  note_turn_without_params(w, r, filter.captured().has_value());
  if (filter.take_new_capture() && r.conversation && w.conversations) {
    co_await remember_turn(*w.conversations, *r.conversation, *filter.captured(),
                           w.cfg.conversation_ttl, r.view->request_id);
  }
  const std::size_t size = r.first.size();
  bool reuse = false;
  if (carries_no_body(r.ex->status())) {
    reuse = co_await write_whole_answer(client, req, *r.ex, std::move(r.first), r.view->request_id);
  } else {
    // Written from here, not in write_whole_answer's frame: what the
    // socket takes at once costs no coroutine.
    const std::string head = whole_answer_head(req, *r.ex, r.view->request_id, size);
    beast::error_code ec;
    if (auto rest = write_head_and_body(client, head, r.first, ec))
      ec = co_await std::move(*rest);
    reuse = !ec && req.keep_alive();
  }
  c.outcome.count_sent(size);
  co_return reuse;
}

// The events of a Responses API stream that carry tokens: those named
// `response.<...>.delta` (output text, reasoning text, a function call's
// arguments). An event's name is its `event:` line.
std::size_t delta_events(std::string_view ready) {
  constexpr std::string_view kName = "event: response.";
  std::size_t n = 0;
  for (std::size_t at = ready.find(kName); at != std::string_view::npos;
       at = ready.find(kName, at + kName.size())) {
    if (at != 0 && ready[at - 1] != '\n' && ready[at - 1] != '\r')
      continue;  // inside a data line
    std::string_view line = ready.substr(at, ready.find_first_of("\r\n", at) - at);
    if (line.ends_with(".delta"))
      ++n;
  }
  return n;
}

// The event a stream ends with when usage was asked for: no choices, and
// the usage object.
bool is_usage_event(std::string_view data) {
  const auto index = index_json_object(data);
  if (!index)
    return false;
  const auto choices = raw_member(data, *index, "choices");
  const auto usage = raw_member(data, *index, "usage");
  if (!choices || !usage || *usage == "null")
    return false;
  JsonArrayElements elements(*choices);
  std::string_view first;
  return !elements.next(first) && !elements.failed();
}

}  // namespace

StreamRelay::StreamRelay(WorkerContext& w, UpstreamExchange& ex, const Instance& decode,
                         const std::string& request_id, OptionalTurn& conversation, bool want_usage,
                         bool strip_usage, bool named_events,
                         const std::optional<std::uint64_t>* cached_tokens)
    : w_(w),
      ex_(ex),
      decode_(decode),
      request_id_(request_id),
      conversation_(conversation),
      want_usage_(want_usage),
      strip_usage_(strip_usage),
      named_events_(named_events),
      cached_tokens_(cached_tokens) {}

StreamRelay::Filtering& StreamRelay::filtering() {
  if (!filtering_) {
    filtering_.reset(new Filtering{
        SseEvent{}, DecodeOutputFilter(decode_.spec.host, w_.cfg.expose_kv_params,
                                       conversation_ ? &conversation_->recorder : nullptr)});
  }
  return *filtering_;
}

void StreamRelay::time_events(std::string_view ready, std::size_t events) {
  if (named_events_)
    events = delta_events(ready);
  // The closing [DONE] is no token.
  for (std::string_view done : {"data: [DONE]\n\n", "data: [DONE]\r\n\r\n", "data:[DONE]\n\n"}) {
    if (ready.ends_with(done)) {
      --events;
      break;
    }
  }
  if (events == 0)
    return;
  const auto now = std::chrono::steady_clock::now();
  auto& itl = decode_.latency.inter_token;
  if (!first_event_at_) {
    first_event_at_ = now;
  } else {
    itl.observe(std::chrono::duration<double>(now - last_event_at_).count());
  }
  if (events > 1)
    itl.observe_n(0, events - 1);
  last_event_at_ = now;
}

net::awaitable<UpstreamError> StreamRelay::read_into(std::string& out) {
  in_.clear();
  // Events buffered already (the first ones usually come with the
  // header) are taken without the frame of a read_some.
  bool wanted = true;
  UpstreamError err = ex_.take_buffered(in_, kFirstRead, wanted);
  if (!err && wanted)
    err = co_await ex_.read_some(in_);
  if (err)
    co_return err;
  if (!scanner_.feed(in_)) {
    co_return UpstreamError{UpstreamFailure::protocol, "decode stream from " + decode_.spec.url +
                                                           " is malformed: " + scanner_.error()};
  }
  // Events pass through as the same bytes unless the filter has to look
  // at them: a turn's answer being recorded, or params to capture or hide
  // (an event that names kv_transfer_params). Then one by one; otherwise
  // all of them at once, without parsing each.
  const std::string_view ready = scanner_.ready_bytes();
  if (const std::size_t events = scanner_.ready_count(); events > 0) {
    time_events(ready, events);
    if (want_usage_) {
      if (auto u = last_usage(ready, true))
        usage_ = u;
    }
  }
  // The chunk is searched for a usage only when something is to be done
  // with one: most streams (no stripping, no prefill count) skip the scan.
  const bool merging = cached_tokens_ && cached_tokens_->has_value();
  const bool has_usage =
      (strip_usage_ || merging) && ready.find("\"usage\"") != std::string_view::npos;
  const bool strip = strip_usage_ && has_usage;
  // Decode counts the blocks it received as cached; the client is told
  // prefill's count, the prompt's real cache hit.
  const bool merge = !strip && has_usage && merging;
  if (!conversation_ && !strip && !merge &&
      ready.find("kv_transfer_params") == std::string_view::npos) {
    out.append(ready);
    scanner_.drop_ready();
  } else {
    Filtering& f = filtering();
    while (scanner_.next(f.event)) {
      if (strip && is_usage_event(f.event.data))
        continue;
      if (merge && f.event.has_data) {
        if (auto merged = with_cached_tokens(f.event.data, **cached_tokens_)) {
          f.event.data = std::move(*merged);
          f.event.raw = sse_data_event(f.event.data);
        }
      }
      out += f.filter.on_event(f.event);
    }
  }
  // Stored before the client sees the end of the turn, so a client that
  // sends its next turn at once (to any replica) finds them.
  if (filtering_ && filtering_->filter.take_new_capture() && conversation_ && w_.conversations) {
    co_await remember_turn(*w_.conversations, *conversation_, *filtering_->filter.captured(),
                           w_.cfg.conversation_ttl, request_id_);
  }
  // Between events a stream may idle for minutes: it holds no event
  // buffers meanwhile (a few small allocations per event instead).
  // swap, not assignment: a moved-in short string keeps the old buffer.
  std::string().swap(in_);
  if (filtering_) {
    std::string().swap(filtering_->event.raw);
    std::string().swap(filtering_->event.data);
  }
  scanner_.release_idle_memory();
  co_return UpstreamError{};
}

net::awaitable<bool> write_whole_answer(MaybeTlsStream& client,
                                        const http::request<http::string_body>& req,
                                        const UpstreamExchange& ex, std::string body,
                                        const std::string& request_id) {
  const unsigned status = ex.status();
  if (carries_no_body(status)) {
    // Beast's framing rules.
    http::response<http::string_body> res{static_cast<http::status>(status), req.version()};
    res.set(http::field::server, "pdgate");
    if (!ex.content_type().empty())
      res.set(http::field::content_type, ex.content_type());
    if (!ex.cache_control().empty())
      res.set(http::field::cache_control, ex.cache_control());
    res.set("X-Request-Id", request_id);
    res.keep_alive(req.keep_alive());
    res.body() = std::move(body);
    res.prepare_payload();
    co_return co_await write_response(client, res) && req.keep_alive();
  }
  const std::string head = whole_answer_head(req, ex, request_id, body.size());
  beast::error_code ec;
  if (auto rest = write_head_and_body(client, head, body, ec))
    ec = co_await std::move(*rest);
  co_return !ec && req.keep_alive();
}

// Not a coroutine itself: a held stream's chain of frames is one shorter.
net::awaitable<bool> relay_answer(ClientRequest& c, DecodeRelay& r, StreamResume* resume) {
  if (r.stream)
    return relay_stream(c, r, resume);
  return relay_whole(c, r);
}

ResumableListing::ResumableListing(WorkerContext& w, StreamResume& rs) : w_(w), rs_(rs) {
  rs.slot = w.resumable_streams.size();
  w.resumable_streams.push_back(&rs);
}

ResumableListing::~ResumableListing() {
  auto& list = w_.resumable_streams;
  StreamResume* last = list.back();
  list[rs_.slot] = last;
  last->slot = rs_.slot;
  list.pop_back();
}

std::size_t migrate_streams(WorkerContext& w, std::uint64_t instance_id) {
  std::size_t moved = 0;
  // Copy: cutting a leg off may run no handler now, but keep the walk
  // independent of the list anyway.
  const auto streams = w.resumable_streams;
  for (StreamResume* rs : streams) {
    DecodeRelay* r = rs->current;
    if (r == nullptr || rs->broke || !r->ex || !r->stream || r->stream->done() ||
        r->decode->id != instance_id)
      continue;
    rs->broke = UpstreamError{UpstreamFailure::ejected,
                              "instance " + r->decode->spec.url + " drained: deadline passed"};
    rs->reason = BreakReason::drain;
    r->ex->abort_ejected();
    ++moved;
  }
  return moved;
}

void count_migration(WorkerContext& w, BreakReason reason, MigrationOutcome outcome) {
  if (w.metrics)
    w.metrics
        ->decode_migrations[static_cast<std::size_t>(reason)][static_cast<std::size_t>(outcome)]
        .fetch_add(1, std::memory_order_relaxed);
}

const char* to_string(BreakReason r) {
  switch (r) {
    case BreakReason::reset:
      return "reset";
    case BreakReason::error_event:
      return "error_event";
    case BreakReason::stall:
      return "stall";
    case BreakReason::drain:
      return "drain";
  }
  return "reset";
}

void note_broken(WorkerContext& w, DecodeRelay& r, const UpstreamError& failure) {
  spdlog::warn("request {}: decode stream broke off: {}", r.view->request_id, failure.detail);
  note_failure(w, *r.decode, failure.detail);
  trace_error(r.span, upstream_failure(Stage::decode, failure));
}

net::awaitable<bool> end_broken_stream(ClientRequest& c, const StreamResume& rs) {
  const http::request<http::string_body>& req = c.req;
  std::string ev;
  if (rs.transcript.saw_done()) {
    // Everything came, [DONE] included; only the body's end did not.
  } else if (rs.transcript.finished() && !rs.client_usage && rs.transcript.resumable()) {
    // The engine finished the answer (its finish_reason came) and died
    // before the [DONE] that frames it: nothing of the answer is missing.
    ev = "data: [DONE]\n\n";
  } else {
    ev = broken_stream_event(c.w, *rs.broke);
  }
  if (!co_await write_chunk(c.client, ev, c.w.cfg, true))
    co_return false;
  c.outcome.count_sent(ev.size());
  co_return req.keep_alive();
}

}  // namespace pdgate
