#include "core/pipeline/resumption.hpp"

#include <algorithm>
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
  out.data.clear();
  // Lines up to the blank one that ends the event ("\n", "\r\n" or "\r").
  while (pos < events.size()) {
    std::size_t eol = events.find_first_of("\r\n", pos);
    if (eol == std::string_view::npos)
      eol = events.size();
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
      if (out.has_data)
        out.data += '\n';
      out.data.append(value);
      out.has_data = true;
    }
  }
  out.end = pos;
  return true;
}

void StreamTranscript::refuse(std::string why) {
  if (why_not_.empty())
    why_not_ = std::move(why);
  std::string().swap(text_);
}

std::size_t StreamTranscript::observe(std::string_view events) {
  std::size_t pos = 0;
  SplitEvent ev;
  while (next_event(events, pos, ev)) {
    if (!ev.has_data)
      continue;
    if (!on_data(ev.data)) {
      error_event_ = true;
      return ev.begin;
    }
  }
  return events.size();
}

bool StreamTranscript::on_data(std::string_view data) {
  if (data == "[DONE]") {
    done_ = true;
    finished_ = true;
    return true;
  }
  const auto index = index_json_object(data);
  if (!index)
    return true;  // not JSON: relayed as it is, nothing to learn from it
  const auto choices = present(data, *index, "choices");
  if (!choices && present(data, *index, "error"))
    return false;
  if (id_.empty()) {
    if (auto v = present(data, *index, "id"))
      id_ = *v;
    if (auto v = present(data, *index, "created"))
      created_ = *v;
    if (auto v = present(data, *index, "model"))
      model_ = *v;
  }
  if (!choices)
    return true;
  JsonArrayElements elements(*choices);
  std::string_view choice;
  while (elements.next(choice))
    on_choice(choice);
  return true;
}

void StreamTranscript::on_choice(std::string_view choice) {
  const auto index = index_json_object(choice);
  if (!index)
    return refuse("a choice that is not a JSON object");
  if (auto i = present(choice, *index, "index"); i && *i != "0")
    return refuse("more than one choice (n > 1)");
  if (present(choice, *index, "finish_reason"))
    finished_ = true;
  std::optional<std::string_view> piece;
  if (chat_) {
    const auto delta = present(choice, *index, "delta");
    if (!delta)
      return;
    const auto d = index_json_object(*delta);
    if (!d)
      return refuse("a delta that is not a JSON object");
    if (present(*delta, *d, "tool_calls"))
      return refuse("a tool-call stream");
    if (present(*delta, *d, "reasoning_content") || present(*delta, *d, "reasoning"))
      return refuse("a reasoning stream");
    piece = present(*delta, *d, "content");
  } else {
    piece = present(choice, *index, "text");
  }
  std::uint64_t tokens = 0;
  if (auto ids = present(choice, *index, "token_ids")) {
    JsonArrayElements e(*ids);
    std::string_view id;
    while (e.next(id))
      ++tokens;
  }
  if (piece) {
    auto text = decode_json_string(*piece);
    if (!text)
      return refuse("a text that is not a JSON string");
    if (tokens == 0 && !text->empty())
      tokens = 1;
    if (why_not_.empty()) {
      if (text_.size() + text->size() > kMaxResumableText)
        return refuse("an answer longer than the text kept for resuming");
      text_ += *text;
    }
  }
  tokens_ += tokens;
}

std::optional<std::string> continuation_body(std::string_view body, const JsonObjectIndex& index,
                                             bool chat, const StreamTranscript& t,
                                             std::string& why_not) {
  auto refuse = [&](std::string why) -> std::optional<std::string> {
    why_not = std::move(why);
    return std::nullopt;
  };
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
                       bool client_usage)
    : id_(t.id()),
      created_(t.created()),
      model_(t.model()),
      emitted_tokens_(t.tokens()),
      prompt_tokens_(prompt_tokens),
      client_usage_(client_usage) {}

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
  bool has_choices = false;
  bool carries_something = false;
  if (auto c = j.find("choices"); c != j.end() && c->is_array()) {
    for (auto& choice : *c) {
      if (!choice.is_object())
        continue;
      has_choices = true;
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
