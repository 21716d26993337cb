#include "core/routing/turn_history.hpp"

#include <array>
#include <charconv>
#include <utility>

namespace pdgate {

namespace {

// The fingerprint is SHA-256 over this encoding (docs/conversations.md):
//
//   chat:        "pdgate turn v2\0chat\0" members
//                then per message: u64 length, the message's JSON text
//                then "\0answer\0", u64 message count, the answer text
//   completions: "pdgate turn v2\0completion\0" members
//                then the prompt text immediately followed by the answer
//
// where `members` are the request members that shape the prompt besides
// the messages (kShapingMembers), each as u64 0 when absent, else u64
// length + 1 and its JSON text. Every variable-size field is
// length-prefixed or, for the answer and the completions text, last, so
// two different histories never encode to the same bytes. A completions
// entry only needs the prompt+answer bytes to be a prefix of the next
// prompt, so there the two are one run of text.
constexpr std::string_view kChatHeader{"pdgate turn v2\0chat\0", 20};
constexpr std::string_view kCompletionHeader{"pdgate turn v2\0completion\0", 26};
constexpr std::string_view kAnswerMarker{"\0answer\0", 8};

// Members that change the rendered prompt as much as the messages do: the
// model (another model's blocks are meaningless), the tool definitions and
// the chat template with its arguments (both rendered into the prompt).
constexpr std::array<std::string_view, 4> kShapingMembers = {"model", "tools", "chat_template",
                                                             "chat_template_kwargs"};

constexpr std::string_view kKeyDomain{"pdgate conversation key v2\0", 27};

std::string_view trim_ws(std::string_view s) {
  while (!s.empty() && is_json_ws(s.front()))
    s.remove_prefix(1);
  while (!s.empty() && is_json_ws(s.back()))
    s.remove_suffix(1);
  return s;
}

// A JSON value that carries nothing: null, "", [] or {} (inner whitespace
// allowed). Answers and assistant messages may have such members (vLLM
// writes "tool_calls": [] and "reasoning_content": null); anything else
// in them is content the comparison of texts does not cover.
bool carries_nothing(std::string_view raw) {
  raw = trim_ws(raw);
  if (raw == "null" || raw == "\"\"")
    return true;
  if (raw.size() >= 2 &&
      ((raw.front() == '[' && raw.back() == ']') || (raw.front() == '{' && raw.back() == '}')))
    return trim_ws(raw.substr(1, raw.size() - 2)).empty();
  return false;
}

void hash_members(Sha256& h, std::string_view body, const JsonObjectIndex& index) {
  for (const std::string_view key : kShapingMembers) {
    const auto raw = raw_member(body, index, key);
    if (!raw) {
      h.update_u64(0);
      continue;
    }
    h.update_u64(raw->size() + 1);
    h.update(*raw);
  }
}

std::optional<std::string> finish_hex(Sha256 h) {
  auto d = h.finish();
  if (!d)
    return std::nullopt;
  return to_hex(*d);
}

bool is_hex64(std::string_view s) {
  if (s.size() != 64)
    return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return false;
  }
  return true;
}

// The assistant message a continuing chat request carries where the stored
// turn's answer was: role "assistant", content the string decode produced,
// and no other member that carries anything. Returns its content.
std::optional<std::string> assistant_content(std::string_view message) {
  const auto index = index_json_object(message);
  if (!index)
    return std::nullopt;
  if (string_member(message, *index, "role") != "assistant")
    return std::nullopt;
  for (const JsonMember& m : index->members) {
    if (m.key == "role" || m.key == "content")
      continue;
    if (!carries_nothing(message.substr(m.value_begin, m.value_end - m.value_begin)))
      return std::nullopt;
  }
  return string_member(message, *index, "content");
}

}  // namespace

std::optional<std::string> conversation_store_key(std::string_view scope,
                                                  std::string_view conversation_id) {
  Sha256 h;
  h.update(kKeyDomain);
  h.update_u64(scope.size());
  h.update(scope);
  h.update_u64(conversation_id.size());
  h.update(conversation_id);
  return finish_hex(std::move(h));
}

std::string encode_stored_turn(const StoredTurn& turn) {
  std::string out;
  out.reserve(96 + turn.fingerprint.size() + turn.params.size());
  out += R"({"v":2,"kind":")";
  out += turn.kind == TurnKind::chat ? "chat" : "completion";
  out += R"(","n":)";
  out += std::to_string(turn.extent);
  out += R"(,"fp":")";
  out += turn.fingerprint;
  out += R"(","params":)";
  out += turn.params;
  out += '}';
  return out;
}

std::optional<StoredTurn> decode_stored_turn(std::string_view value) {
  const auto index = index_json_object(value);
  if (!index)
    return std::nullopt;
  const auto v = raw_member(value, *index, "v");
  if (!v || *v != "2")
    return std::nullopt;
  StoredTurn t;
  const auto kind = string_member(value, *index, "kind");
  if (kind == "chat") {
    t.kind = TurnKind::chat;
  } else if (kind == "completion") {
    t.kind = TurnKind::completion;
  } else {
    return std::nullopt;
  }
  const auto n = raw_member(value, *index, "n");
  if (!n)
    return std::nullopt;
  const auto [end, ec] = std::from_chars(n->data(), n->data() + n->size(), t.extent);
  if (ec != std::errc() || end != n->data() + n->size())
    return std::nullopt;
  auto fp = string_member(value, *index, "fp");
  if (!fp || !is_hex64(*fp))
    return std::nullopt;
  t.fingerprint = std::move(*fp);
  const auto params = raw_member(value, *index, "params");
  if (!params || params->empty() || params->front() != '{')
    return std::nullopt;
  t.params = std::string(*params);
  return t;
}

TurnRecorder::TurnRecorder(TurnKind kind, std::uint64_t history_extent, Sha256 state)
    : kind_(kind), history_extent_(history_extent), state_(std::move(state)) {}

void TurnRecorder::add_answer(std::string_view text) {
  answer_bytes_ += text.size();
  if (answer_bytes_ > kMaxFingerprintedAnswerBytes) {
    spoiled_ = true;
    return;
  }
  state_.update(text);
}

void TurnRecorder::on_choice(std::string_view choice, std::string_view field) {
  const auto index = index_json_object(choice);
  if (!index) {
    spoiled_ = true;
    return;
  }
  // Only the first choice is the conversation's next message; with n > 1
  // the client picks one and the gateway cannot know which.
  if (const auto i = raw_member(choice, *index, "index"); i && trim_ws(*i) != "0") {
    spoiled_ = true;
    return;
  }
  if (kind_ == TurnKind::completion) {
    const auto text = raw_member(choice, *index, "text");
    if (!text || *text == "null")
      return;
    auto decoded = decode_json_string(*text);
    if (!decoded) {
      spoiled_ = true;
      return;
    }
    add_answer(*decoded);
    return;
  }
  const auto raw = raw_member(choice, *index, field);
  if (!raw || *raw == "null")
    return;
  const auto msg = index_json_object(*raw);
  if (!msg) {
    spoiled_ = true;
    return;
  }
  for (const JsonMember& m : msg->members) {
    const std::string_view value = raw->substr(m.value_begin, m.value_end - m.value_begin);
    if (m.key == "role") {
      if (value != "null" && decode_json_string(value) != "assistant")
        spoiled_ = true;
    } else if (m.key == "content") {
      if (value == "null")
        continue;
      auto decoded = decode_json_string(value);
      if (!decoded) {
        spoiled_ = true;  // content parts, or anything but a string
      } else {
        add_answer(*decoded);
      }
    } else if (!carries_nothing(value)) {
      spoiled_ = true;  // tool calls, reasoning, audio: not in the text compared
    }
    if (spoiled_)
      return;
  }
}

TurnRecorder TurnRecorder::fork() const {
  TurnRecorder r(kind_, history_extent_, state_.fork());
  r.answer_bytes_ = answer_bytes_;
  r.spoiled_ = spoiled_;
  return r;
}

void TurnRecorder::on_chunk(std::string_view json) {
  if (spoiled_)
    return;
  const auto index = index_json_object(json);
  if (!index)
    return;  // [DONE], or not JSON: no answer text in it
  if (raw_member(json, *index, "error")) {
    spoiled_ = true;
    return;
  }
  const auto choices = raw_member(json, *index, "choices");
  if (!choices || *choices == "null")
    return;
  JsonArrayElements elements(*choices);
  std::string_view choice;
  while (!spoiled_ && elements.next(choice))
    on_choice(choice, "delta");
  if (elements.failed())
    spoiled_ = true;
}

void TurnRecorder::on_body(std::string_view json) {
  if (spoiled_)
    return;
  const auto index = index_json_object(json);
  if (!index || raw_member(json, *index, "error")) {
    spoiled_ = true;
    return;
  }
  const auto choices = raw_member(json, *index, "choices");
  if (!choices) {
    spoiled_ = true;
    return;
  }
  JsonArrayElements elements(*choices);
  std::string_view choice;
  while (!spoiled_ && elements.next(choice))
    on_choice(choice, "message");
  if (elements.failed())
    spoiled_ = true;
}

std::optional<StoredTurn> TurnRecorder::entry(std::string params) const {
  if (spoiled_)
    return std::nullopt;
  auto fp = finish_hex(state_.fork());
  if (!fp)
    return std::nullopt;
  StoredTurn t;
  t.kind = kind_;
  t.extent = kind_ == TurnKind::chat ? history_extent_ : history_extent_ + answer_bytes_;
  t.fingerprint = std::move(*fp);
  t.params = std::move(params);
  return t;
}

HistoryReading read_history(std::string_view body, const JsonObjectIndex& index, bool is_chat,
                            const StoredTurn* previous) {
  HistoryReading out;
  // With echo the answer text starts with text the model did not generate:
  // the next history would not be what decode's blocks hold.
  const bool fingerprintable = bool_member(body, index, "echo") != true;
  const TurnKind kind = is_chat ? TurnKind::chat : TurnKind::completion;
  if (previous != nullptr && previous->kind != kind)
    previous = nullptr;
  Sha256 h;
  h.update(is_chat ? kChatHeader : kCompletionHeader);
  hash_members(h, body, index);

  if (!is_chat) {
    const auto prompt = string_member(body, index, "prompt");
    if (!prompt)
      return out;  // token ids or a batch of prompts: not one text
    const std::string_view text = *prompt;
    std::size_t hashed = 0;
    if (previous != nullptr && previous->extent <= text.size()) {
      h.update(text.substr(0, previous->extent));
      hashed = previous->extent;
      out.continues = finish_hex(h.fork()) == previous->fingerprint;
    }
    h.update(text.substr(hashed));
    if (fingerprintable)
      out.own.emplace(kind, text.size(), std::move(h));
    return out;
  }

  const auto messages = raw_member(body, index, "messages");
  if (!messages)
    return out;
  JsonArrayElements elements(*messages);
  std::string_view message;
  std::uint64_t count = 0;
  while (elements.next(message)) {
    if (previous != nullptr && count == previous->extent) {
      if (const auto content = assistant_content(message)) {
        Sha256 check = h.fork();
        check.update(kAnswerMarker);
        check.update_u64(count);
        check.update(*content);
        out.continues = finish_hex(std::move(check)) == previous->fingerprint;
      }
    }
    h.update_u64(message.size());
    h.update(message);
    ++count;
  }
  if (elements.failed()) {
    out.continues = false;
    return out;
  }
  h.update(kAnswerMarker);
  h.update_u64(count);
  if (fingerprintable)
    out.own.emplace(kind, count, std::move(h));
  return out;
}

}  // namespace pdgate
