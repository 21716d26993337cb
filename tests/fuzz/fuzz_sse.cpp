// Splitting a stream into pieces must never change the events it yields:
// the first byte picks the piece size, the rest is the stream. The relay
// also looks for the engine's token usage in the events it completes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/json_body.hpp"
#include "core/net/sse.hpp"
#include "core/observability/usage.hpp"
#include "core/pipeline/resumption.hpp"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant failed: %s\n", what);
    std::abort();
  }
}

struct Run {
  std::vector<pdgate::SseEvent> events;
  std::size_t pending = 0;
};

Run scan(std::string_view stream, std::size_t piece, bool pop_each) {
  // The cap is above libFuzzer's input sizes: cap behaviour has unit tests.
  pdgate::SseScanner s(1u << 24);
  Run r;
  pdgate::SseEvent ev;
  for (std::size_t i = 0; i < stream.size(); i += piece) {
    check(s.feed(stream.substr(i, piece)), "feed failed under the cap");
    while (pop_each && s.next(ev))
      r.events.push_back(ev);
  }
  while (s.next(ev))
    r.events.push_back(ev);
  r.pending = s.pending_bytes();
  return r;
}

std::string raw_of(const Run& r) {
  std::string out;
  for (const auto& e : r.events)
    out += e.raw;
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0)
    return 0;
  const std::size_t piece = data[0] % 16 + 1;
  const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Run whole = scan(stream, stream.size() + 1, true);
  const Run late = scan(stream, piece, false);
  const Run eager = scan(stream, piece, true);
  // One feed, or many feeds popped at the end: raw bytes are exact.
  const std::string raw = raw_of(whole);
  check(raw + std::string(stream.substr(raw.size())) == stream, "raw bytes differ from input");
  check(whole.pending == stream.size() - raw.size(), "pending count wrong");
  check(raw_of(late) == raw, "split feeding changed raw bytes");
  check(late.pending == whole.pending, "split feeding changed pending bytes");
  check(eager.events.size() == whole.events.size(), "eager popping changed the event count");
  for (std::size_t i = 0; i < whole.events.size(); ++i) {
    for (const auto* other : {&late.events[i], &eager.events[i]}) {
      check(other->data == whole.events[i].data, "data differs");
      check(other->has_data == whole.events[i].has_data, "has_data differs");
      check(other->is_done == whole.events[i].is_done, "is_done differs");
      check(other->comment_only == whole.events[i].comment_only, "comment_only differs");
    }
  }
  // Usage is searched from the end: what follows the last event cannot
  // hide the counts in the complete events when it holds no "usage" key.
  const auto usage = pdgate::last_usage(raw, true);
  if (stream.substr(raw.size()).find("\"usage\"") == std::string_view::npos) {
    const auto all = pdgate::last_usage(stream, true);
    check(all.has_value() == usage.has_value(), "trailing bytes changed the usage found");
  }
  // A prefill's answer (its cached_tokens) and decode's usage with
  // prefill's count merged in: engine output, untrusted.
  (void)pdgate::prompt_cached_tokens(stream);
  if (const auto merged = pdgate::with_cached_tokens(stream, 7)) {
    check(pdgate::index_json_object(*merged).ok(), "merged usage is not a JSON object");
    check(pdgate::prompt_cached_tokens(*merged) == 7u, "merged cached_tokens not read back");
  }
  // A resumed stream (core/pipeline/resumption.hpp) reads every event the
  // client is sent, rewrites a resumed leg's, and builds a continuation
  // from what it read: engine output, untrusted, for both APIs.
  for (const bool chat : {true, false}) {
    pdgate::StreamTranscript t(chat);
    const std::size_t kept = t.observe(raw);
    check(kept <= raw.size(), "the transcript kept more than it was given");
    // The same events with the ids cut (--resume-token-ids): only bytes
    // removed, what follows the kept part untouched, the same text read.
    {
      pdgate::StreamTranscript cut(chat);
      std::string stripped = raw;
      const std::size_t cut_kept = cut.observe(stripped, true);
      check(cut_kept <= stripped.size() && stripped.size() <= raw.size(),
            "cutting ids added bytes");
      check(stripped.substr(cut_kept) == raw.substr(kept), "cutting ids changed what follows");
      check(cut.text() == t.text(), "cutting ids changed the text read");
    }
    check(t.text().size() <= pdgate::kMaxResumableText, "the transcript outgrew its bound");
    pdgate::ResumedLeg leg(t, std::nullopt, chat);
    pdgate::StreamTranscript after(chat);
    (void)after.observe(leg.rewrite(raw));
    const std::string body = chat
                                 ? R"({"messages":[{"role":"user","content":"x"}],"max_tokens":50})"
                                 : R"({"prompt":"x","max_tokens":50})";
    const auto index = pdgate::index_json_object(body);
    std::string why;
    bool completion_leg = false;
    if (const auto next = pdgate::continuation_body(body, *index, chat, t, why, &completion_leg))
      check(pdgate::index_json_object(*next).ok(), "the continuation is not a JSON object");
    // A chat stream continued as a completion of its token ids: that leg's
    // events (engine output again) in the chat form.
    pdgate::ResumedLeg as_chat(t, std::nullopt, true, true);
    (void)as_chat.rewrite(raw);
  }
  return 0;
}
