// Resuming a stream whose decode broke off mid-answer (docs/resumption.md).
// The gateway has relayed every event the client got, so it knows the
// prompt and exactly what was emitted: another P/D pair is sent the
// continuation (the partial assistant message with vLLM's
// continue_final_message, or the prompt extended by the answer), and its
// events are spliced into the client's stream as if one engine had written
// them all: same id, created and model, no second role chunk, one [DONE],
// one usage summing both legs.
//
// Three pieces, each pure (no I/O), so every rule is unit-tested:
// StreamTranscript watches the events the client is sent, continuation_body
// builds the resumed leg's request, ResumedLeg rewrites its events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/json_body.hpp"
#include "core/observability/metrics.hpp"

namespace pdgate {

namespace detail {
class EventReader;
}

// Most answer text kept per stream for a continuation: past it the stream
// is no longer resumable (and the text is freed), so a held stream costs a
// bounded amount however long its answer.
inline constexpr std::size_t kMaxResumableText = 1u << 20;
// Most token-id text (the prompt's and the answer's ids) kept per stream;
// past it a stream is resumed from its text.
inline constexpr std::size_t kMaxTokenIdText = 4u << 20;

// What the client has been sent of one stream, read event by event.
class StreamTranscript {
 public:
  explicit StreamTranscript(bool chat) : chat_(chat) {}

  // Reads complete SSE events about to go to the client and returns how
  // many of their bytes may go: all of them, or those before an engine's
  // error event (error_event() then says so; the rest is not the client's).
  std::size_t observe(std::string_view events);
  // The same, and (`strip_ids`) the token ids the gateway asked an engine
  // for (--resume-token-ids) are cut from `events` (every prompt_token_ids
  // and token_ids member, at the top and in choices); the size returned
  // counts in the cut bytes.
  std::size_t observe(std::string& events, bool strip_ids);

  // An error event came in the stream (vLLM's mid-stream failure).
  bool error_event() const { return error_event_; }
  // Whether a continuation can reproduce what is missing: one choice, no
  // tool calls or reasoning, text kept within kMaxResumableText. Else the
  // reason, for the log.
  bool resumable() const { return why_not_.empty(); }
  const std::string& why_not() const { return why_not_; }
  // The answer's text so far, and the tokens it took (token_ids when the
  // engine returned them, else one per event that carried text).
  const std::string& text() const { return text_; }
  std::uint64_t tokens() const { return tokens_; }
  // A finish_reason or [DONE] came: the answer is complete.
  bool finished() const { return finished_; }
  bool saw_done() const { return done_; }
  // Token ids, when the stream carried them (vLLM's return_token_ids):
  // the prompt's and every emitted token's, as JSON numbers joined by
  // commas. A continuation then goes on from exactly these tokens instead
  // of the text re-tokenized. False when they did not come, some text came
  // without its ids, or they passed kMaxTokenIdText.
  bool token_exact() const { return ids_exact_ && !prompt_ids_.empty(); }
  const std::string& prompt_ids() const { return prompt_ids_; }
  const std::string& ids() const { return ids_; }
  // The first event's envelope (raw JSON values), which a resumed leg's
  // events are given.
  const std::string& id() const { return id_; }
  const std::string& created() const { return created_; }
  const std::string& model() const { return model_; }

  // Marks the stream as not resumable (the first reason is kept).
  void refuse(std::string why);

 private:
  struct EventFacts;
  // Where bytes are to be cut from the events observed (stripping ids):
  // ranges, and where the event being read starts in them.
  struct Cuts {
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    std::size_t base = 0;
  };
  // Reads the complete events of `events` (noting the ids to cut in
  // `cuts` when given); returns how many bytes precede an error event, or
  // all of them.
  std::size_t read_events(std::string_view events, Cuts* cuts);
  // One event's data; false when it is an error event.
  bool on_data(std::string_view data, Cuts* cuts = nullptr);
  // One element of its choices at the reader's cursor; false when the
  // event is not JSON.
  bool on_choice(detail::EventReader& r, EventFacts& facts);

  const bool chat_;
  bool error_event_ = false;
  bool finished_ = false;
  bool done_ = false;
  std::string why_not_;
  std::string text_;
  std::uint64_t tokens_ = 0;
  std::string id_;
  std::string created_;
  std::string model_;
  void take_ids(const EventFacts& facts);
  void drop_ids();
  bool ids_exact_ = true;
  std::string prompt_ids_;
  std::string ids_;
  // Engines send every event of a stream in one shape. `shape_` holds the
  // first event's bytes up to its choices' '[' (the envelope, skipped in
  // later events that start with the same bytes), then those of a token
  // event around its text: before it (`head_` bytes) and after it (the
  // rest). An event that is the same bytes around another text differs
  // from that one only in its text. At most kMaxShape bytes in all.
  static constexpr std::size_t kMaxShape = 768;
  bool token_event(std::string_view data);
  void learn_shape(std::string_view data, std::size_t choices_at, const EventFacts& facts);
  std::string shape_;
  std::uint16_t envelope_ = 0;  // shape_'s envelope length (0: none yet)
  std::uint16_t head_ = 0;      // the token event's bytes before its text (0: none yet)
};

// The resumed leg's body: the client's `body` (indexed by `index`) made a
// continuation of `t` — chat: the partial answer appended as the final
// assistant message with continue_final_message: true and
// add_generation_prompt: false; completions: the prompt extended by it —
// with max_tokens (and max_completion_tokens) less what was emitted, and
// stream_options.include_usage set so the legs' usage can be summed.
// Nullopt, with `why_not` set, when the request cannot be continued so
// (n > 1, best_of, echo, a token-id prompt, its own continue_final_message,
// nothing left to generate).
//
// When the stream carried token ids (t.token_exact()), the continuation is
// token-exact: a completion's prompt becomes the prompt's ids followed by
// the answer's; a chat stream (when `completion_leg` is given, the request
// sets a token limit and asks no logprobs, whose chat form a completion
// does not give) is continued as a completion of those ids, sent to
// /v1/completions, `*completion_leg` then true.
std::optional<std::string> continuation_body(std::string_view body, const JsonObjectIndex& index,
                                             bool chat, const StreamTranscript& t,
                                             std::string& why_not, bool* completion_leg = nullptr);

// Rewrites a resumed leg's events into the client's stream.
class ResumedLeg {
 public:
  // `t`: the stream so far (its envelope and emitted tokens);
  // `prompt_tokens`: the original prompt's length when known (prefill's
  // usage), else derived from this leg's usage; `client_usage`: the client
  // asked for usage (otherwise the usage event, asked for by the gateway,
  // is dropped).
  // `completion_leg`: the leg is a completion continuing a chat stream
  // (its events are given the chat chunks' form).
  ResumedLeg(const StreamTranscript& t, std::optional<std::uint64_t> prompt_tokens,
             bool client_usage, bool completion_leg = false);

  // Complete SSE events in, the client's bytes out.
  std::string rewrite(std::string_view events);
  // The summed usage, once this leg's usage event came.
  const std::optional<TokenUsage>& usage() const { return usage_; }

 private:
  std::string rewrite_data(std::string_view data);

  std::string id_;
  std::string created_;
  std::string model_;
  std::uint64_t emitted_tokens_;
  std::optional<std::uint64_t> prompt_tokens_;
  bool client_usage_;
  bool completion_leg_;
  std::optional<TokenUsage> usage_;
};

// The next complete event of `events` from `pos`: its data lines joined
// (has_data false for an event with none, e.g. a comment), `pos` moved past
// it. False at the end. `data` views `events` when the event has one data
// line (an engine's always do), else `joined`.
struct SplitEvent {
  std::size_t begin = 0;
  std::size_t end = 0;
  bool has_data = false;
  std::string_view data;
  std::string joined;
};
bool next_event(std::string_view events, std::size_t& pos, SplitEvent& out);

}  // namespace pdgate
