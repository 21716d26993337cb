// Decode answers a streaming request with text/event-stream, and the
// gateway relays it to the client event by event: it must look inside each
// event ([DONE], errors, usage, kv_transfer_params) without ever treating a
// read that ends mid-event as a malformed event. SseScanner cuts the byte
// stream into complete events per the WHATWG SSE parsing rules.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace pdgate {

struct SseEvent {
  // The exact bytes of the event, including the blank line that ends it,
  // so the gateway can relay events it does not change without re-encoding.
  std::string raw;
  // The values of the event's `data` fields joined with '\n' (the one
  // optional space after the colon removed).
  std::string data;
  bool has_data = false;      // at least one `data` field, even an empty one
  bool is_done = false;       // has_data and data == "[DONE]"
  bool comment_only = false;  // only comment lines (e.g. ": keepalive")
};

class SseScanner {
 public:
  explicit SseScanner(std::size_t max_event_bytes = 16u << 20);

  // Appends bytes. Returns false (and sets error()) once an event grows
  // beyond the cap: the caller aborts the stream. Events completed before
  // the failure can still be popped.
  bool feed(std::string_view bytes);

  // Pops the next complete event, if any. The total cost of feeding and
  // popping is linear in the bytes fed, however they are split.
  bool next(SseEvent& out);

  // The raw bytes of every complete event not popped yet, back to back
  // (what next() would hand out, one event after another), and dropping
  // them: for a relay that passes events through unchanged, without
  // copying or parsing each one.
  std::string_view ready_bytes() const;
  void drop_ready();
  // Complete events not popped yet.
  std::size_t ready_count() const { return ready_.size() - ready_head_; }

  // Frees the buffers when no byte is held (all events popped, no partial
  // event): for streams that idle between events.
  void release_idle_memory();

  // Bytes of an incomplete event held.
  std::size_t pending_bytes() const { return buf_.size() - event_begin_; }

  const std::string& error() const { return error_; }

 private:
  void compact();

  std::size_t max_event_bytes_;
  std::string buf_;
  std::size_t head_ = 0;  // start of the first complete event not popped yet
  // Lengths of the complete events from head_ on, the first at
  // ready_[ready_head_]. A vector, not a deque: libstdc++'s deque allocates
  // ~600 bytes even when empty, and a relayed stream holds its scanner for
  // as long as it lasts (10,000 idle streams: 6 MiB).
  std::vector<std::size_t> ready_;
  std::size_t ready_head_ = 0;
  std::size_t event_begin_ = 0;  // start of the incomplete event
  std::size_t scan_ = 0;         // next byte to examine
  bool line_empty_ = true;       // no byte of the current line seen yet
  // The previous byte ended a line with '\r': a '\n' right after it belongs
  // to the same line ending, even when it arrives in a later feed.
  bool after_cr_ = false;
  std::string error_;
};

// `data: <json>\n\n`. Line breaks inside `json` (pretty-printed JSON can
// only have them between tokens) become separate data lines, which the
// client joins back with '\n'.
std::string sse_data_event(std::string_view json);

}  // namespace pdgate
