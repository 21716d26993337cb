// Relaying decode's answer to the client. A stream's events go out as
// they complete, those that arrived together in one write; a whole answer
// goes out once read. Decode's output passes through the conversation
// filter (core/routing/conversation.hpp), which captures and hides
// kv_transfer_params.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http.hpp>
#include "core/net/maybe_tls_stream.hpp"

#include "core/net/sse.hpp"
#include "core/pipeline/engine_call.hpp"
#include "core/pipeline/request_context.hpp"
#include "core/pipeline/resumption.hpp"
#include "core/routing/conversation.hpp"

namespace pdgate {

// Reads decode's event stream and turns it into the bytes the client
// gets: complete SSE events only (a read that ends mid-event keeps the
// partial event for the next), through the output filter.
class StreamRelay {
 public:
  // `want_usage`: decode was asked for usage (stream_options.include_usage),
  // so the stream's last event carries it. `strip_usage`: the gateway
  // asked for it, not the client, whose stream goes without that event.
  // `named_events`: a Responses API stream, whose events are named
  // (`event: response.output_text.delta`) and only the `.delta` ones carry
  // tokens: the others (response.created, ...) are not timed.
  // `cached_tokens` (when set, read as events come): prefill's count,
  // which the usage the client gets reports.
  StreamRelay(WorkerContext& w, UpstreamExchange& ex, const Instance& decode,
              const std::string& request_id, OptionalTurn& conversation, bool want_usage,
              bool strip_usage = false, bool named_events = false,
              const std::optional<std::uint64_t>* cached_tokens = nullptr);

  bool done() const { return ex_.done(); }

  // One read from decode; appends the client bytes it completed to `out`
  // (possibly none).
  net::awaitable<UpstreamError> read_into(std::string& out);
  // Whether decode's kv_transfer_params for the next turn were seen.
  bool captured_params() const { return filtering_ && filtering_->filter.captured().has_value(); }

  // When the first data event arrived (once one did): the first token
  // (the first `.delta` event of a named-events stream).
  std::optional<std::chrono::steady_clock::time_point> first_event_at() const {
    return first_event_at_;
  }
  // The engine's token counts, once an event carried them.
  const std::optional<TokenUsage>& usage() const { return usage_; }

 private:
  // Times the data events a read completed: the first one is the time to
  // first token, each later one the gap since the one before. Events that
  // arrived in the same read came together: the first takes the gap, the
  // others count as 0. One clock reading per read, not per event or byte.
  void time_events(std::string_view ready, std::size_t events);

  WorkerContext& w_;
  UpstreamExchange& ex_;
  const Instance& decode_;
  const std::string& request_id_;
  OptionalTurn& conversation_;
  // Events are looked at one by one only when a turn's answer is recorded
  // or an event names kv_transfer_params; until then (most streams, for
  // their whole life) the filter and its event take no memory.
  struct Filtering {
    SseEvent event;
    DecodeOutputFilter filter;
  };
  Filtering& filtering();

  SseScanner scanner_;
  std::unique_ptr<Filtering> filtering_;
  std::string in_;
  const bool want_usage_;
  const bool strip_usage_;
  const bool named_events_;
  const std::optional<std::uint64_t>* cached_tokens_;
  std::optional<TokenUsage> usage_;
  std::optional<std::chrono::steady_clock::time_point> first_event_at_;
  std::chrono::steady_clock::time_point last_event_at_{};
};

// Decode answered 2xx and the client's first bytes are ready: a stream's
// first events (or its end), or a whole answer's body. Handed from the
// routing phases to the relay.
// One allocation holds it all (it lives as long as the stream).
struct DecodeRelay {
  // A parallel decode leg's connection scope: outlives `ex`, whose
  // connection is registered in it.
  std::unique_ptr<LegScope> leg_scope;
  std::unique_ptr<RequestView> view;
  InFlightGuard guard;
  std::optional<StageReport> report;  // refers to the request's PickContext
  std::unique_ptr<UpstreamExchange> ex;
  InstancePtr decode;
  OptionalTurn conversation;          // the turn whose answer may be stored
  std::optional<StreamRelay> stream;  // empty: a whole answer
  std::string first;                  // the stream's first events, or the whole body
  // When the first data event (a stream) or the whole answer arrived;
  // empty for a stream that ended without one.
  std::optional<std::chrono::steady_clock::time_point> first_token_at;
  StageSpan span;  // the decode call's: ends with the relay
  // Prefill's cached_tokens, reported in the client's final usage.
  std::optional<std::uint64_t> cached_tokens;
  // Prefill's prompt_logprobs, put into a whole answer's null ones.
  std::optional<std::string> prompt_logprobs;
  // Prefill's usage.prompt_tokens: the prompt a resumed stream reports.
  std::optional<std::uint64_t> prompt_tokens;
};

// Why a stream's decode broke off (pdgate_decode_migrations_total{reason}).
enum class BreakReason { reset, error_event, stall, drain };
const char* to_string(BreakReason r);
// What came of it: resumed on another decode, failed (the resumed leg
// could not be started), refused (not tried).
enum class MigrationOutcome { resumed, failed, refused };
// Counts a stream's break in pdgate_decode_migrations_total.
void count_migration(WorkerContext& w, BreakReason reason, MigrationOutcome outcome);

// A stream that may be resumed on another decode if its decode breaks off
// (core/pipeline/resumption.hpp): the relay shows it every event the
// client is sent, and instead of ending the stream with an error event it
// stops and says why (`broke`), for the caller to resume it.
struct StreamResume {
  explicit StreamResume(bool chat) : transcript(chat) {}
  StreamTranscript transcript;
  // Set while a resumed leg relays: rewrites its events.
  std::optional<ResumedLeg> leg;
  // The failure the relay stopped at, and its kind.
  std::optional<UpstreamError> broke;
  BreakReason reason = BreakReason::reset;
  unsigned migrations = 0;    // legs resumed so far
  bool client_usage = false;  // the client asked for a usage event
  // The current leg continues a chat stream as a completion (token-exact).
  bool completion_leg = false;
  // The gateway asked the engines for token ids (--resume-token-ids): they
  // are cut from what the client is sent.
  bool strip_ids = false;
  // The leg relaying now (null between legs), for migrate_streams().
  DecodeRelay* current = nullptr;
  // Its place in its worker's resumable_streams, while listed.
  std::size_t slot = 0;
};

// Lists `rs` in its worker's resumable streams for as long as it lives.
class ResumableListing {
 public:
  ResumableListing(WorkerContext& w, StreamResume& rs);
  ~ResumableListing();
  ResumableListing(const ResumableListing&) = delete;
  ResumableListing& operator=(const ResumableListing&) = delete;

 private:
  WorkerContext& w_;
  StreamResume& rs_;
};

// A drain's deadline passed: every stream of this worker relaying from
// `instance_id` is cut off there and resumed elsewhere (reason drain).
// Returns how many.
std::size_t migrate_streams(WorkerContext& w, std::uint64_t instance_id);

// Writes decode's answer to the client: the header with the first bytes,
// then the rest. Returns whether the client connection may be reused.
// With `resume` (streams), a decode that breaks off leaves the stream open
// and resume->broke set; a resumed leg (resume->leg set) continues the
// stream already started.
net::awaitable<bool> relay_answer(ClientRequest& c, DecodeRelay& r, StreamResume* resume = nullptr);

// Decode broke off mid-stream: logged, counted against the instance, noted
// on its span.
void note_broken(WorkerContext& w, DecodeRelay& r, const UpstreamError& failure);

// The end of a stream that broke off and was not resumed: the client is
// sent the in-band error event (or, when the answer was complete but for
// its [DONE], that).
net::awaitable<bool> end_broken_stream(ClientRequest& c, const StreamResume& rs);

// A non-streaming engine answer as the client gets it: the status, the
// headers that describe the body, the body.
net::awaitable<bool> write_whole_answer(MaybeTlsStream& client,
                                        const http::request<http::string_body>& req,
                                        const UpstreamExchange& ex, std::string body,
                                        const std::string& request_id);

}  // namespace pdgate
