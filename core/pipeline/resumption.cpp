#include "core/pipeline/resumption.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/base/json_edit.hpp"

namespace pdgate {

namespace {

using ojson = nlohmann::ordered_json;

// A member that is there and not null.
std::optional<std::string_view> present(std::string_view text, const JsonObjectIndex& index,
                                        std::string_view key) {
  auto raw = raw_member(text, index, key);
  if (!raw || *raw == "null")
    return std::nullopt;
  return raw;
}

bool is_true(std::string_view text, const JsonObjectIndex& index, std::string_view key) {
  return bool_member(text, index, key).value_or(false);
}

}  // namespace

bool next_event(std::string_view events, std::size_t& pos, SplitEvent& out) {
  if (pos >= events.size())
    return false;
  out.begin = pos;
  out.has_data = false;
  out.data = {};
  // How engines send an event: one "data:" line and a blank one.
  if (events.compare(pos, 5, "data:") == 0) {
    const std::size_t nl = events.find('\n', pos);
    if (nl != std::string_view::npos && nl + 1 < events.size() && events[nl + 1] == '\n' &&
        std::memchr(events.data() + pos, '\r', nl - pos) == nullptr) {
      std::string_view value = events.substr(pos + 5, nl - pos - 5);
      if (value.starts_with(' '))
        value.remove_prefix(1);
      out.data = value;
      out.has_data = true;
      pos = nl + 2;
      out.end = pos;
      return true;
    }
  }
  bool joining = false;
  // Lines up to the blank one that ends the event ("\n", "\r\n" or "\r").
  while (pos < events.size()) {
    // A line ends at "\n" or "\r" (two searches, not find_first_of, which
    // calls memchr for every byte it passes).
    std::size_t eol = events.find('\n', pos);
    if (eol == std::string_view::npos)
      eol = events.size();
    if (const void* cr = std::memchr(events.data() + pos, '\r', eol - pos))
      eol = static_cast<const char*>(cr) - events.data();
    const std::string_view line = events.substr(pos, eol - pos);
    pos = eol;
    if (pos < events.size() && events[pos] == '\r')
      ++pos;
    if (pos < events.size() && events[pos] == '\n')
      ++pos;
    if (line.empty())
      break;
    if (line.starts_with("data:")) {
      std::string_view value = line.substr(5);
      if (value.starts_with(' '))
        value.remove_prefix(1);
      if (!out.has_data) {
        out.data = value;
      } else {
        if (!joining) {
          out.joined.assign(out.data);
          joining = true;
        }
        out.joined += '\n';
        out.joined.append(value);
      }
      out.has_data = true;
    }
  }
  if (joining)
    out.data = out.joined;
  out.end = pos;
  return true;
}

void StreamTranscript::refuse(std::string why) {
  if (why_not_.empty())
    why_not_ = std::move(why);
  std::string().swap(text_);
}

std::size_t StreamTranscript::read_events(std::string_view events, Cuts* cuts) {
  std::size_t pos = 0;
  SplitEvent ev;
  while (next_event(events, pos, ev)) {
    if (!ev.has_data)
      continue;
    // Only an event whose data is one line (as engines send) is cut: its
    // data lies in `events` as it is.
    Cuts* event_cuts = nullptr;
    if (cuts != nullptr && ev.data.data() >= events.data() &&
        ev.data.data() < events.data() + events.size()) {
      cuts->base = static_cast<std::size_t>(ev.data.data() - events.data());
      event_cuts = cuts;
    }
    if (!on_data(ev.data, event_cuts)) {
      error_event_ = true;
      return ev.begin;
    }
  }
  return events.size();
}

std::size_t StreamTranscript::observe(std::string_view events) {
  return read_events(events, nullptr);
}

std::size_t StreamTranscript::observe(std::string& events, bool strip_ids) {
  if (!strip_ids)
    return read_events(events, nullptr);
  Cuts cuts;
  const std::size_t keep = read_events(events, &cuts);
  if (cuts.ranges.empty())
    return keep;
  std::string out;
  out.reserve(events.size());
  std::size_t at = 0;
  for (const auto& [begin, end] : cuts.ranges) {
    if (begin > at)
      out.append(events, at, begin - at);
    at = std::max(at, end);
  }
  out.append(events, at, keep - at);
  const std::size_t kept = out.size();
  out.append(events, keep, std::string::npos);
  events = std::move(out);
  return kept;
}

namespace detail {

// One event's JSON, read in a single forgiving pass that descends only
// where the transcript looks (choices, each choice, its delta) and skips
// every other value by its brackets and quotes. Every stream event passes
// here on its way to the client, so it costs one look at each byte, no
// allocation; a strict validation (three passes for a delta's content)
// made a short stream's relay cost 1.24x. The bytes reach the client as
// the engine sent them whatever this reads; what the transcript keeps is
// checked where it matters (the text is decoded strictly). A duplicate
// key is read each time it comes.
class EventReader {
 public:
  explicit EventReader(std::string_view text) : t_(text) {}

  // Calls on(key) for each member of the object at the cursor; on() reads
  // the member's value (value(), members() or elements()). False when the
  // text is not an object or on() returns false.
  template <class F>
  bool members(F&& on) {
    ws();
    if (!eat('{'))
      return false;
    const std::size_t open = p_;
    ws();
    if (eat('}'))
      return true;
    return member_list(on, true, open);
  }
  // The rest of an object after a member's value (at the cursor's end).
  template <class F>
  bool after_member(F&& on) {
    const std::size_t value_end = p_;
    ws();
    if (eat(','))
      return member_list(on, false, value_end);
    return eat('}');
  }

  // The bytes that remove the member whose value was just read with
  // value() (called right after it, before any other read): its key and
  // value with the comma that joins it to the member before it, or (the
  // first member) to the one after it.
  std::pair<std::size_t, std::size_t> member_cut() {
    cut_taken_at_ = cut_key_at_;
    if (!cut_first_)
      return {cut_prev_end_, p_};
    std::size_t end = p_;
    while (end < t_.size() && is_json_ws(t_[end]))
      ++end;
    if (end < t_.size() && t_[end] == ',')
      return {cut_key_at_, end + 1};
    return {cut_key_at_, p_};
  }

  // Calls on() for each element of the array at the cursor.
  template <class F>
  bool elements(F&& on) {
    ws();
    if (!eat('['))
      return false;
    ws();
    if (eat(']'))
      return true;
    for (;;) {
      ws();
      if (!on())
        return false;
      ws();
      if (eat(','))
        continue;
      return eat(']');
    }
  }

  // The value at the cursor, skipped: its raw text.
  std::optional<std::string_view> value() {
    ws();
    const std::size_t begin = p_;
    if (p_ >= t_.size())
      return std::nullopt;
    const char c = t_[p_];
    if (c == '"')
      return string_literal();
    if (c == '{' || c == '[') {
      // Brackets counted, strings skipped whole; no recursion.
      std::size_t depth = 0;
      while (p_ < t_.size()) {
        const char d = t_[p_];
        if (d == '"') {
          if (!string_literal())
            return std::nullopt;
          continue;
        }
        ++p_;
        if (d == '{' || d == '[') {
          ++depth;
        } else if (d == '}' || d == ']') {
          if (--depth == 0)
            return t_.substr(begin, p_ - begin);
        }
      }
      return std::nullopt;
    }
    // A number or a literal: up to what ends it.
    while (p_ < t_.size() && !ends_scalar(t_[p_]))
      ++p_;
    if (p_ == begin)
      return std::nullopt;
    return t_.substr(begin, p_ - begin);
  }

  bool at(char c) {
    ws();
    return p_ < t_.size() && t_[p_] == c;
  }
  // Only whitespace is left.
  bool at_end() {
    ws();
    return p_ == t_.size();
  }
  std::size_t pos() const { return p_; }
  void seek(std::size_t pos) { p_ = pos; }

 private:
  // `first`: the object's first member comes; `prev_end`: where the value
  // before it (or the '{') ends.
  template <class F>
  bool member_list(F&& on, bool first, std::size_t prev_end) {
    for (;;) {
      ws();
      const std::size_t key_at = p_;
      const auto raw = string_literal();
      if (!raw)
        return false;
      ws();
      if (!eat(':'))
        return false;
      std::string_view key = raw->substr(1, raw->size() - 2);
      if (key.find('\\') != std::string_view::npos) {
        // Keys with escapes are rare: decoded, strictly.
        key_.clear();
        if (!append_json_string(*raw, key_))
          return false;
        key = key_;
      }
      ws();
      cut_first_ = first;
      cut_prev_end_ = prev_end;
      cut_key_at_ = key_at;
      if (!on(key))
        return false;
      const std::size_t value_end = p_;
      // A first member cut with the comma after it leaves the next one
      // first.
      const bool cut_as_first = first && cut_taken_at_ == key_at;
      ws();
      if (eat(',')) {
        if (!cut_as_first) {
          first = false;
          prev_end = value_end;
        }
        continue;
      }
      return eat('}');
    }
  }
  static bool ends_scalar(char c) {
    return c == ',' || c == '}' || c == ']' || c == ':' || c == '"' || is_json_ws(c);
  }
  void ws() {
    while (p_ < t_.size() && is_json_ws(t_[p_]))
      ++p_;
  }
  bool eat(char c) {
    if (p_ < t_.size() && t_[p_] == c) {
      ++p_;
      return true;
    }
    return false;
  }
  // The string literal at the cursor, quotes included.
  std::optional<std::string_view> string_literal() {
    if (!eat('"'))
      return std::nullopt;
    const std::size_t begin = p_ - 1;
    for (;;) {
      const std::size_t q = t_.find('"', p_);
      if (q == std::string_view::npos)
        return std::nullopt;
      // Escaped when an odd number of backslashes comes before it.
      std::size_t slashes = 0;
      while (q - slashes > p_ && t_[q - 1 - slashes] == '\\')
        ++slashes;
      p_ = q + 1;
      if (slashes % 2 == 0)
        return t_.substr(begin, p_ - begin);
    }
  }

  std::string_view t_;
  std::size_t p_ = 0;
  std::string key_;
  // The member being read (member_cut()).
  bool cut_first_ = false;
  std::size_t cut_prev_end_ = 0;
  std::size_t cut_key_at_ = 0;
  std::size_t cut_taken_at_ = static_cast<std::size_t>(-1);
};

}  // namespace detail

namespace {

// A value that is there and not null.
std::optional<std::string_view> non_null(std::optional<std::string_view> value) {
  if (value && *value == "null")
    return std::nullopt;
  return value;
}

}  // namespace

// What one event tells, kept apart until the whole event has been read:
// an event that is not JSON after all teaches nothing.
struct StreamTranscript::EventFacts {
  std::size_t text_before = 0;
  std::uint64_t tokens = 0;
  bool finished = false;
  bool choices = false;
  std::string why_not;
  // For learning the stream's token-event shape: how many choices, and
  // the one choice's text (a view of the event) when it is a plain token.
  std::size_t choice_count = 0;
  bool plain_token = false;
  std::string_view text;
  // Token ids (vLLM's return_token_ids): the prompt's (chat: the event's,
  // completions: the choice's) and this event's tokens'.
  std::optional<std::string_view> prompt_ids;
  std::optional<std::string_view> token_ids;
  bool text_without_ids = false;
  // Id members to cut (when stripping), in the event's bytes.
  std::vector<std::pair<std::size_t, std::size_t>> cuts;
  bool cutting = false;
};

namespace {

// Appends a JSON array's elements, each a plain non-negative integer, to
// `out` joined by commas. False for anything else.
bool append_ids(std::string_view array, std::string& out) {
  JsonArrayElements e(array);
  std::string_view id;
  while (e.next(id)) {
    if (id.empty() || id.size() > 10 ||
        id.find_first_not_of("0123456789") != std::string_view::npos ||
        (id.size() > 1 && id.front() == '0'))
      return false;
    if (!out.empty())
      out += ',';
    out.append(id);
  }
  return !e.failed();
}

}  // namespace

void StreamTranscript::drop_ids() {
  ids_exact_ = false;
  std::string().swap(prompt_ids_);
  std::string().swap(ids_);
}

void StreamTranscript::take_ids(const EventFacts& facts) {
  if (!ids_exact_)
    return;
  if (facts.text_without_ids)
    return drop_ids();
  if (facts.prompt_ids && prompt_ids_.empty() && !append_ids(*facts.prompt_ids, prompt_ids_))
    return drop_ids();
  if (facts.token_ids && !append_ids(*facts.token_ids, ids_))
    return drop_ids();
  if (prompt_ids_.size() + ids_.size() > kMaxTokenIdText)
    drop_ids();
}

bool StreamTranscript::token_event(std::string_view data) {
  if (head_ == 0 || !why_not_.empty())
    return false;
  const std::string_view lead(shape_.data(), head_);
  const std::string_view tail = std::string_view(shape_).substr(head_);
  if (data.size() < lead.size() + tail.size() + 2 || !data.starts_with(lead) ||
      !data.ends_with(tail))
    return false;
  const std::string_view literal =
      data.substr(lead.size(), data.size() - lead.size() - tail.size());
  if (literal.front() != '"' || literal.back() != '"')
    return false;
  // One string literal (a quote inside it ends the match): most tokens
  // have no escape and are taken as they are; others are decoded strictly.
  const std::string_view inner = literal.substr(1, literal.size() - 2);
  bool plain = true;
  for (const char c : inner)
    plain = plain && c != '"' && c != '\\';
  if (plain)
    text_.append(inner);
  else if (!append_json_string(literal, text_))
    return false;
  if (literal != "\"\"") {
    ++tokens_;
    // A token without its id: the ids no longer tell the answer.
    if (ids_exact_)
      drop_ids();
  }
  if (text_.size() > kMaxResumableText)
    refuse("an answer longer than the text kept for resuming");
  return true;
}

void StreamTranscript::learn_shape(std::string_view data, std::size_t choices_at,
                                   const EventFacts& facts) {
  if (envelope_ == 0) {
    if (choices_at == 0 || choices_at + 1 > kMaxShape)
      return;
    shape_.assign(data.substr(0, choices_at + 1));
    envelope_ = static_cast<std::uint16_t>(choices_at + 1);
  }
  // A token event: one choice, a text that is not empty (a role chunk's
  // is), nothing that finishes or refuses, no token ids (which differ
  // from event to event), in the stream's envelope.
  if (head_ != 0 || facts.choice_count != 1 || !facts.plain_token || facts.finished ||
      !facts.why_not.empty() || facts.text.size() <= 2 ||
      !data.starts_with(std::string_view(shape_.data(), envelope_)))
    return;
  const std::size_t at = static_cast<std::size_t>(facts.text.data() - data.data());
  const std::size_t after = at + facts.text.size();
  if (at + (data.size() - after) > kMaxShape)
    return;
  shape_.assign(data.substr(0, at));
  shape_.append(data.substr(after));
  head_ = static_cast<std::uint16_t>(at);
}

bool StreamTranscript::on_data(std::string_view data, Cuts* cuts) {
  if (data == "[DONE]") {
    done_ = true;
    finished_ = true;
    return true;
  }
  // The same shape as the stream's token events: only the text is new.
  // (Never one with ids: a token event's shape holds none.)
  if (token_event(data))
    return true;
  EventFacts facts;
  facts.cutting = cuts != nullptr;
  facts.text_before = text_.size();
  std::optional<std::string_view> error, id, created, model;
  std::size_t choices_at = 0;
  detail::EventReader r(data);
  auto choices = [&] { return r.elements([&] { return on_choice(r, facts); }); };
  auto member = [&](std::string_view key) {
    if (key == "choices") {
      if (!r.at('[')) {
        // Not an array: there, but no choice to read.
        const auto v = r.value();
        if (v && *v != "null")
          facts.choices = true;
        return v.has_value();
      }
      facts.choices = true;
      if (choices_at == 0)
        choices_at = r.pos();
      return choices();
    }
    const auto v = r.value();
    if (!v)
      return false;
    if (facts.cutting && (key == "prompt_token_ids" || key == "token_ids"))
      facts.cuts.push_back(r.member_cut());
    if (key == "error")
      error = non_null(v);
    else if (chat_ && key == "prompt_token_ids")
      facts.prompt_ids = non_null(v);
    else if (key == "id")
      id = non_null(v);
    else if (key == "created")
      created = non_null(v);
    else if (key == "model")
      model = non_null(v);
    return true;
  };
  const std::string_view envelope(shape_.data(), envelope_);
  bool read = false;
  if (envelope_ > 0 && data.starts_with(envelope)) {
    // The members before the choices are this stream's envelope, byte for
    // byte, as an engine sends them in every event: read once, in the
    // first event (they would be read the same), and skipped since.
    facts.choices = true;
    r.seek(envelope.size() - 1);
    read = choices() && r.after_member(member);
  } else {
    read = r.members(member);
  }
  if (!read || !r.at_end()) {
    // Not JSON: relayed as it is, nothing to learn from it.
    if (why_not_.empty())
      text_.resize(facts.text_before);
    return true;
  }
  if (!facts.choices && error)
    return false;
  if (id_.empty()) {
    if (id)
      id_ = *id;
    if (created)
      created_ = *created;
    if (model)
      model_ = *model;
  }
  learn_shape(data, choices_at, facts);
  take_ids(facts);
  if (cuts != nullptr) {
    // In the order of the bytes (a choice's members come before the
    // event's members that follow the choices).
    std::sort(facts.cuts.begin(), facts.cuts.end());
    for (const auto& [begin, end] : facts.cuts)
      cuts->ranges.emplace_back(cuts->base + begin, cuts->base + end);
  }
  tokens_ += facts.tokens;
  finished_ = finished_ || facts.finished;
  if (!facts.why_not.empty())
    refuse(std::move(facts.why_not));
  else if (why_not_.empty() && text_.size() > kMaxResumableText)
    refuse("an answer longer than the text kept for resuming");
  return true;
}

bool StreamTranscript::on_choice(detail::EventReader& r, EventFacts& facts) {
  ++facts.choice_count;
  if (!r.at('{')) {
    if (!r.value())
      return false;
    facts.why_not = "a choice that is not a JSON object";
    return true;
  }
  std::optional<std::string_view> index, text, token_ids;
  bool has_delta = false;
  bool delta_read = true;
  const bool read = r.members([&](std::string_view key) {
    if (chat_ && key == "delta") {
      if (!r.at('{')) {
        const auto v = r.value();
        if (v && *v != "null") {
          has_delta = true;
          delta_read = false;
        }
        return v.has_value();
      }
      has_delta = true;
      return r.members([&](std::string_view k) {
        const auto v = r.value();
        if (!v)
          return false;
        if (k == "content") {
          text = non_null(v);
        } else if ((k == "tool_calls" || k == "reasoning_content" || k == "reasoning") &&
                   non_null(v) && facts.why_not.empty()) {
          facts.why_not = k == "tool_calls" ? "a tool-call stream" : "a reasoning stream";
        }
        return true;
      });
    }
    const auto v = r.value();
    if (!v)
      return false;
    if (facts.cutting && (key == "prompt_token_ids" || key == "token_ids"))
      facts.cuts.push_back(r.member_cut());
    if (key == "index")
      index = non_null(v);
    else if (key == "finish_reason")
      facts.finished = facts.finished || non_null(v).has_value();
    else if (!chat_ && key == "text")
      text = non_null(v);
    else if (key == "token_ids")
      token_ids = non_null(v);
    else if (!chat_ && key == "prompt_token_ids")
      facts.prompt_ids = non_null(v);
    return true;
  });
  if (!read)
    return false;
  auto refuse_event = [&](const char* why) {
    if (facts.why_not.empty())
      facts.why_not = why;
    return true;
  };
  if (!delta_read)
    return refuse_event("a delta that is not a JSON object");
  if (index && *index != "0")
    return refuse_event("more than one choice (n > 1)");
  if (chat_ && !has_delta)
    return true;
  std::uint64_t tokens = 0;
  if (token_ids) {
    JsonArrayElements e(*token_ids);
    std::string_view id;
    while (e.next(id))
      ++tokens;
  }
  if (text) {
    if (text->front() != '"')
      return refuse_event("a text that is not a JSON string");
    if (tokens == 0 && *text != "\"\"")
      tokens = 1;
    // Decoded strictly, into the text kept (bounded per event by the
    // event, and per stream once the event is read).
    if (why_not_.empty() && facts.why_not.empty() && !append_json_string(*text, text_))
      return refuse_event("a text that is not a JSON string");
    facts.plain_token = !token_ids;
    facts.text = *text;
    if (!token_ids && *text != "\"\"")
      facts.text_without_ids = true;
  }
  if (token_ids)
    facts.token_ids = token_ids;
  facts.tokens += tokens;
  return true;
}

namespace {

// What a completion takes of a chat request's fields: those the two
// requests share (sampling, limits on output, structure, scheduling);
// the chat's own (messages, templates, tools, reasoning, logprobs in
// their chat form) have no place in a completion of token ids.
constexpr std::string_view kSharedWithCompletions[] = {"model",
                                                       "frequency_penalty",
                                                       "logit_bias",
                                                       "presence_penalty",
                                                       "seed",
                                                       "stop",
                                                       "temperature",
                                                       "top_p",
                                                       "user",
                                                       "top_k",
                                                       "min_p",
                                                       "repetition_penalty",
                                                       "length_penalty",
                                                       "stop_token_ids",
                                                       "include_stop_str_in_output",
                                                       "ignore_eos",
                                                       "min_tokens",
                                                       "skip_special_tokens",
                                                       "spaces_between_special_tokens",
                                                       "allowed_token_ids",
                                                       "bad_words",
                                                       "response_format",
                                                       "structured_outputs",
                                                       "priority",
                                                       "cache_salt",
                                                       "vllm_xargs",
                                                       "return_token_ids",
                                                       "thinking_token_budget",
                                                       "repetition_detection",
                                                       "stream",
                                                       "stream_options"};

// A chat stream's continuation as a completion of `ids` (the templated
// prompt's and the answer's tokens): nullopt when the chat request cannot
// be so continued (its limit unknown: a completion's default is 16
// tokens, not the rest of the context; chat logprobs asked for).
std::optional<std::string> chat_as_completion(std::string_view body, const JsonObjectIndex& index,
                                              const std::string& ids, std::int64_t left) {
  if (bool_member(body, index, "logprobs").value_or(false))
    return std::nullopt;
  ojson out = ojson::object();
  for (const auto key : kSharedWithCompletions) {
    if (const auto raw = present(body, index, key)) {
      ojson v = ojson::parse(*raw, nullptr, false);
      if (v.is_discarded())
        return std::nullopt;
      out[std::string(key)] = std::move(v);
    }
  }
  out["prompt"] = ojson::parse("[" + ids + "]", nullptr, false);
  if (out["prompt"].is_discarded())
    return std::nullopt;
  out["max_tokens"] = left;
  // The next leg's ids too, should it break off in turn.
  out["return_token_ids"] = true;
  // The legs' usage is summed: this one must report its own.
  if (!out["stream_options"].is_object())
    out["stream_options"] = ojson::object();
  out["stream_options"]["include_usage"] = true;
  return out.dump();
}

}  // namespace

std::optional<std::string> continuation_body(std::string_view body, const JsonObjectIndex& index,
                                             bool chat, const StreamTranscript& t,
                                             std::string& why_not, bool* completion_leg) {
  auto refuse = [&](std::string why) -> std::optional<std::string> {
    why_not = std::move(why);
    return std::nullopt;
  };
  if (completion_leg != nullptr)
    *completion_leg = false;
  if (!t.resumable())
    return refuse(t.why_not());
  if (auto n = present(body, index, "n"); n && *n != "1")
    return refuse("n > 1");
  if (auto b = present(body, index, "best_of"); b && *b != "1")
    return refuse("best_of");
  if (is_true(body, index, "echo"))
    return refuse("echo");
  JsonBodyEditor editor(body, index);
  // Both limits shrink by what was emitted; the engine's default (the
  // rest of the context) needs no change.
  for (std::string_view key : {"max_tokens", "max_completion_tokens"}) {
    const auto raw = present(body, index, key);
    if (!raw)
      continue;
    const auto limit = integral_value(*raw);
    if (!limit)
      return refuse(std::string(key) + " is not an integer");
    const std::int64_t left = *limit - static_cast<std::int64_t>(t.tokens());
    if (left < 1)
      return refuse("nothing left to generate");
    editor.set(key, std::to_string(left));
  }
  // Token-exact: the prompt's ids and the answer's, as the engine counted
  // them (the text would be tokenized again, maybe otherwise at the seam).
  std::string ids;
  if (t.token_exact()) {
    ids = t.prompt_ids();
    if (!t.ids().empty())
      ids += "," + t.ids();
  }
  if (chat && !ids.empty() && completion_leg != nullptr) {
    std::optional<std::int64_t> limit;
    for (std::string_view key : {"max_completion_tokens", "max_tokens"}) {
      if (const auto raw = present(body, index, key); raw && !limit)
        limit = integral_value(*raw);
    }
    std::optional<std::string> leg;
    if (limit)
      leg = chat_as_completion(body, index, ids, *limit - static_cast<std::int64_t>(t.tokens()));
    if (leg) {
      *completion_leg = true;
      return leg;
    }
  }
  if (chat) {
    if (is_true(body, index, "continue_final_message"))
      return refuse("the request continues a message itself");
    const auto messages = present(body, index, "messages");
    if (!messages || messages->size() < 2 || messages->back() != ']')
      return refuse("no messages");
    std::string_view head = messages->substr(0, messages->size() - 1);
    while (!head.empty() && is_json_ws(head.back()))
      head.remove_suffix(1);
    std::string edited(head);
    if (edited.back() != '[')
      edited += ',';
    edited += R"({"role":"assistant","content":)";
    edited += json_quote(t.text());
    edited += "}]";
    editor.set("messages", std::move(edited));
    editor.set("continue_final_message", "true");
    editor.set("add_generation_prompt", "false");
  } else if (!ids.empty()) {
    // Whatever form the client's prompt had, the engine's ids say it; the
    // next leg's ids too, should it break off in turn.
    editor.set("prompt", "[" + ids + "]");
    editor.set("return_token_ids", "true");
  } else {
    const auto prompt = present(body, index, "prompt");
    if (!prompt)
      return refuse("no prompt");
    std::optional<std::string> text;
    if (prompt->front() == '"') {
      text = decode_json_string(*prompt);
    } else if (prompt->front() == '[') {
      JsonArrayElements e(*prompt);
      std::string_view first;
      std::string_view second;
      if (e.next(first) && !e.next(second) && !e.failed() && first.front() == '"')
        text = decode_json_string(first);
    }
    if (!text)
      return refuse("a prompt that is not one string");
    editor.set("prompt", json_quote(*text + t.text()));
  }
  // The legs' usage is summed: this one must report its own.
  ojson options = ojson::object();
  if (const auto raw = present(body, index, "stream_options")) {
    options = ojson::parse(*raw, nullptr, false);
    if (!options.is_object())
      options = ojson::object();
  }
  options["include_usage"] = true;
  editor.set("stream_options", options.dump());
  return editor.render();
}

ResumedLeg::ResumedLeg(const StreamTranscript& t, std::optional<std::uint64_t> prompt_tokens,
                       bool client_usage, bool completion_leg)
    : id_(t.id()),
      created_(t.created()),
      model_(t.model()),
      emitted_tokens_(t.tokens()),
      prompt_tokens_(prompt_tokens),
      client_usage_(client_usage),
      completion_leg_(completion_leg) {}

std::string ResumedLeg::rewrite(std::string_view events) {
  std::string out;
  out.reserve(events.size() + 64);
  std::size_t pos = 0;
  SplitEvent ev;
  while (next_event(events, pos, ev)) {
    if (!ev.has_data || ev.data == "[DONE]") {
      out.append(events.substr(ev.begin, ev.end - ev.begin));
      continue;
    }
    out += rewrite_data(ev.data);
  }
  return out;
}

std::string ResumedLeg::rewrite_data(std::string_view data) {
  ojson j = ojson::parse(data, nullptr, false);
  if (!j.is_object() || (j.contains("error") && !j.contains("choices")))
    return "data: " + std::string(data) + "\n\n";  // an error event: the transcript sees it
  auto put = [&j](const char* key, const std::string& raw) {
    if (raw.empty() || !j.contains(key))
      return;
    ojson v = ojson::parse(raw, nullptr, false);
    if (!v.is_discarded())
      j[key] = std::move(v);
  };
  put("id", id_);
  put("created", created_);
  put("model", model_);
  j.erase("kv_transfer_params");
  // The client had the prompt's ids from the first leg (this leg's prompt
  // holds the answer too).
  j.erase("prompt_token_ids");
  if (completion_leg_) {
    // A completion continuing a chat stream: its events in a chat chunk's
    // form (text as the delta's content).
    j["object"] = "chat.completion.chunk";
    if (auto u = j.find("usage"); u != j.end() && u->is_null())
      j.erase(u);
    if (auto c = j.find("choices"); c != j.end() && c->is_array()) {
      for (auto& choice : *c) {
        if (!choice.is_object())
          continue;
        ojson chunk = ojson::object();
        chunk["index"] = choice.value("index", ojson(0));
        ojson delta = ojson::object();
        if (auto text = choice.find("text"); text != choice.end() && text->is_string())
          delta["content"] = *text;
        chunk["delta"] = std::move(delta);
        chunk["logprobs"] = nullptr;
        chunk["finish_reason"] = choice.value("finish_reason", ojson());
        if (!chunk["finish_reason"].is_null())
          chunk["stop_reason"] = choice.value("stop_reason", ojson());
        if (auto ids = choice.find("token_ids"); ids != choice.end())
          chunk["token_ids"] = *ids;
        choice = std::move(chunk);
      }
    }
  }
  bool has_choices = false;
  bool carries_something = false;
  if (auto c = j.find("choices"); c != j.end() && c->is_array()) {
    for (auto& choice : *c) {
      if (!choice.is_object())
        continue;
      has_choices = true;
      choice.erase("prompt_token_ids");
      if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
        // The client had its role chunk from the first leg.
        d->erase("role");
        if (auto content = d->find("content");
            content != d->end() && content->is_string() && content->get<std::string>().empty())
          d->erase(content);
        if (!d->empty())
          carries_something = true;
      } else {
        carries_something = true;  // completions: text
      }
      if (auto f = choice.find("finish_reason"); f != choice.end() && !f->is_null())
        carries_something = true;
      if (auto l = choice.find("logprobs"); l != choice.end() && !l->is_null())
        carries_something = true;
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    const auto count = [&](const char* key) -> std::uint64_t {
      auto it = u->find(key);
      return it != u->end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
    };
    const std::uint64_t leg_prompt = count("prompt_tokens");
    const std::uint64_t leg_completion = count("completion_tokens");
    // The prompt is counted once: the original's (prefill's count), else
    // this leg's, which holds the emitted answer too.
    const std::uint64_t prompt =
        prompt_tokens_.value_or(leg_prompt > emitted_tokens_ ? leg_prompt - emitted_tokens_ : 0);
    const std::uint64_t completion = emitted_tokens_ + leg_completion;
    (*u)["prompt_tokens"] = prompt;
    (*u)["completion_tokens"] = completion;
    (*u)["total_tokens"] = prompt + completion;
    usage_ = TokenUsage{prompt, completion};
    if (!client_usage_) {
      if (!has_choices)
        return {};
      j.erase("usage");
    }
  }
  if (has_choices && !carries_something)
    return {};  // the role chunk, now empty
  return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

}  // namespace pdgate
