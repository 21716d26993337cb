#include "core/net/sse.hpp"

#include <cstring>
#include <utility>

namespace pdgate {

SseScanner::SseScanner(std::size_t max_event_bytes) : max_event_bytes_(max_event_bytes) {}

void SseScanner::compact() {
  // Popped lengths go the same way (amortized, as below).
  if (ready_head_ > 0 && ready_head_ * 2 >= ready_.size()) {
    ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(ready_head_));
    ready_head_ = 0;
  }
  // Popped bytes are dropped only when they are at least half the buffer,
  // so each byte is moved a bounded number of times and feeding stays
  // linear even when the caller pops one event per feed.
  if (head_ == 0)
    return;
  if (head_ == buf_.size()) {
    buf_.clear();
  } else if (head_ * 2 >= buf_.size()) {
    buf_.erase(0, head_);
  } else {
    return;
  }
  event_begin_ -= head_;
  scan_ -= head_;
  head_ = 0;
}

void SseScanner::release_idle_memory() {
  if (head_ != buf_.size() || ready_head_ != ready_.size())
    return;
  std::string().swap(buf_);
  std::vector<std::size_t>().swap(ready_);
  head_ = event_begin_ = scan_ = ready_head_ = 0;
}

bool SseScanner::feed(std::string_view bytes) {
  if (!error_.empty())
    return false;
  compact();
  // Usually the buffer is empty here (the previous events were popped):
  // one allocation of the right size rather than a few doublings.
  if (buf_.empty())
    buf_.reserve(bytes.size());
  buf_.append(bytes);
  const char* const data = buf_.data();
  const std::size_t n = buf_.size();
  std::size_t scan = scan_;
  while (scan < n) {
    if (after_cr_) {
      after_cr_ = false;
      if (data[scan] == '\n') {
        if (scan == event_begin_) {
          // The '\r' before this '\n' was the blank line that ended the
          // previous event, which was cut without waiting for this byte (to
          // relay it at once). The '\n' completes that line ending, so it
          // is attached to that event if it is still queued, else dropped.
          if (ready_head_ == ready_.size()) {
            ++head_;
          } else {
            ++ready_.back();
          }
          ++event_begin_;
        }
        ++scan;
        continue;
      }
    }
    // The rest of the line: no line ending in it, nothing to decide.
    // memchr is vectorized: a line costs a few instructions, not a few
    // per byte.
    const char* lf = static_cast<const char*>(std::memchr(data + scan, '\n', n - scan));
    const std::size_t lf_at = lf != nullptr ? static_cast<std::size_t>(lf - data) : n;
    const char* cr = static_cast<const char*>(std::memchr(data + scan, '\r', lf_at - scan));
    const std::size_t eol = cr != nullptr ? static_cast<std::size_t>(cr - data) : lf_at;
    if (eol > scan) {
      line_empty_ = false;
      scan = eol;
      if (scan == n)
        break;
    }
    const char c = data[scan++];
    if (c == '\r') {
      if (scan < n && data[scan] == '\n') {
        ++scan;
      } else {
        after_cr_ = true;
      }
    }
    if (line_empty_) {
      const std::size_t len = scan - event_begin_;
      if (len > max_event_bytes_)
        break;
      // A read usually completes a few events at once: room for eight
      // from the start, not growth through 1, 2 and 4.
      if (ready_.capacity() == 0)
        ready_.reserve(8);
      ready_.push_back(len);
      event_begin_ = scan;
    }
    line_empty_ = true;
  }
  scan_ = scan;
  if (scan_ - event_begin_ > max_event_bytes_ || buf_.size() - event_begin_ > max_event_bytes_) {
    error_ = "SSE event larger than " + std::to_string(max_event_bytes_) + " bytes";
    return false;
  }
  return true;
}

std::string_view SseScanner::ready_bytes() const {
  std::size_t len = 0;
  for (std::size_t i = ready_head_; i < ready_.size(); ++i)
    len += ready_[i];
  return std::string_view(buf_).substr(head_, len);
}

void SseScanner::drop_ready() {
  head_ += ready_bytes().size();
  ready_.clear();
  ready_head_ = 0;
}

bool SseScanner::next(SseEvent& out) {
  if (ready_head_ == ready_.size())
    return false;
  const std::size_t len = ready_[ready_head_++];
  if (ready_head_ == ready_.size()) {
    ready_.clear();
    ready_head_ = 0;
  }
  out.raw.assign(buf_, head_, len);
  head_ += len;

  out.data.clear();
  out.has_data = false;
  bool comment_seen = false;
  bool field_seen = false;
  const std::string_view ev(out.raw);
  std::size_t pos = 0;
  while (pos < ev.size()) {
    std::size_t eol = pos;
    while (eol < ev.size() && ev[eol] != '\n' && ev[eol] != '\r')
      ++eol;
    const std::string_view line = ev.substr(pos, eol - pos);
    pos = eol + 1;
    if (eol < ev.size() && ev[eol] == '\r' && pos < ev.size() && ev[pos] == '\n')
      ++pos;
    if (line.empty())
      break;  // the blank line that ends the event
    if (line.front() == ':') {
      comment_seen = true;
      continue;
    }
    const std::size_t colon = line.find(':');
    const std::string_view name = line.substr(0, colon);
    std::string_view value;
    if (colon != std::string_view::npos) {
      value = line.substr(colon + 1);
      if (!value.empty() && value.front() == ' ')
        value.remove_prefix(1);
    }
    if (name == "data") {
      out.has_data = true;
      out.data.append(value);
      out.data.push_back('\n');
    } else {
      // event, id, retry and unknown fields travel in raw; the gateway
      // only ever looks at data.
      field_seen = true;
    }
  }
  if (out.has_data)
    out.data.pop_back();
  out.is_done = out.has_data && out.data == "[DONE]";
  out.comment_only = comment_seen && !field_seen && !out.has_data;
  return true;
}

std::string sse_data_event(std::string_view json) {
  std::string out;
  out.reserve(json.size() + 8);
  std::size_t pos = 0;
  while (true) {
    std::size_t eol = pos;
    while (eol < json.size() && json[eol] != '\n' && json[eol] != '\r')
      ++eol;
    out += "data: ";
    out.append(json.substr(pos, eol - pos));
    out.push_back('\n');
    if (eol >= json.size())
      break;
    pos = eol + 1;
    if (json[eol] == '\r' && pos < json.size() && json[pos] == '\n')
      ++pos;
  }
  out.push_back('\n');
  return out;
}

}  // namespace pdgate
