#include "sim/tokenizer.hpp"

#include <array>
#include <cstdio>
#include <optional>

namespace pdgate::sim {

using nlohmann::json;

std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t basis) {
  std::uint64_t h = basis;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

void append_token_id(std::string& out, std::int64_t id) {
  // Four little-endian bytes per id: a token-id prompt of n ids is exactly n
  // tokens under the bytes/4 rule.
  auto u = static_cast<std::uint32_t>(id);
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

bool is_token_list(const json& v) {
  if (!v.is_array() || v.empty())
    return false;
  for (const auto& e : v) {
    if (!e.is_number_integer())
      return false;
  }
  return true;
}

// The bytes that identify a media part: its URL or inline data.
std::string media_bytes(const json& part, const std::string& type) {
  if (!part.contains(type))
    return part.dump();
  const json& inner = part[type];
  if (inner.is_string())
    return inner.get<std::string>();
  if (inner.is_object()) {
    if (inner.contains("url") && inner["url"].is_string())
      return inner["url"].get<std::string>();
    if (inner.contains("data") && inner["data"].is_string()) {
      std::string s = inner["data"].get<std::string>();
      if (inner.contains("format") && inner["format"].is_string()) {
        s += inner["format"].get<std::string>();
      }
      return s;
    }
  }
  return inner.dump();
}

void append_media(std::string& out, std::string_view bytes) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(bytes)));
  // 16 copies of 16 hex digits = 256 bytes = kMediaTokens tokens, so a media
  // part adds exactly kMediaTokens to ceil(bytes/4) wherever it sits.
  for (std::size_t i = 0; i < kMediaTokens * kBytesPerToken / 16; ++i)
    out.append(hex, 16);
}

}  // namespace

std::vector<std::uint32_t> token_ids(std::string_view prefix_text) {
  std::vector<std::uint32_t> ids(tokens_for_bytes(prefix_text.size()), 0);
  for (std::size_t i = 0; i < prefix_text.size(); ++i) {
    const auto byte = static_cast<std::uint32_t>(static_cast<unsigned char>(prefix_text[i]));
    ids[i / kBytesPerToken] |= byte << (8 * (i % kBytesPerToken));
  }
  return ids;
}

PromptResult completion_prompt(const json& body) {
  PromptResult r;
  if (!body.is_object() || !body.contains("prompt")) {
    r.error = "'prompt' is required";
    return r;
  }
  const json& p = body["prompt"];
  if (p.is_string()) {
    r.prompt.text = p.get<std::string>();
  } else if (is_token_list(p)) {
    for (const auto& id : p)
      append_token_id(r.prompt.text, id.get<std::int64_t>());
  } else if (p.is_array() && !p.empty() && p[0].is_string()) {
    for (const auto& e : p) {
      if (!e.is_string()) {
        r.error = "'prompt' list must hold only strings or only token ids";
        return r;
      }
    }
    r.prompt.text = p[0].get<std::string>();
  } else if (p.is_array() && !p.empty() && is_token_list(p[0])) {
    for (const auto& id : p[0])
      append_token_id(r.prompt.text, id.get<std::int64_t>());
  } else {
    r.error =
        "'prompt' must be a string, a list of strings, a list of token ids or a list of "
        "token id lists";
    return r;
  }
  r.prompt.tokens = tokens_for_bytes(r.prompt.text.size());
  r.prompt.text_items = 1;
  if (r.prompt.tokens == 0)
    r.error = "Prompt cannot be empty";
  return r;
}

PromptResult chat_prompt(const json& body) {
  PromptResult r;
  if (!body.is_object() || !body.contains("messages") || !body["messages"].is_array() ||
      body["messages"].empty()) {
    r.error = "'messages' must be a non-empty list";
    return r;
  }
  std::string& text = r.prompt.text;
  for (const auto& m : body["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      r.error = "every message needs a string 'role'";
      return r;
    }
    text += m["role"].get<std::string>();
    if (!m.contains("content") || m["content"].is_null())
      continue;
    const json& c = m["content"];
    if (c.is_string()) {
      text += c.get<std::string>();
      ++r.prompt.text_items;
      continue;
    }
    if (!c.is_array()) {
      r.error = "message 'content' must be a string or a list of parts";
      return r;
    }
    for (const auto& part : c) {
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
        r.error = "every content part needs a string 'type'";
        return r;
      }
      const std::string type = part["type"].get<std::string>();
      if (type == "text") {
        if (!part.contains("text") || !part["text"].is_string()) {
          r.error = "a 'text' part needs a string 'text'";
          return r;
        }
        text += part["text"].get<std::string>();
        ++r.prompt.text_items;
      } else if (type == "image_url" || type == "audio_url" || type == "input_audio") {
        append_media(text, media_bytes(part, type));
        ++r.prompt.media_items;
      } else {
        r.error = "unsupported content part type '" + type + "'";
        return r;
      }
    }
  }
  r.prompt.tokens = tokens_for_bytes(text.size());
  return r;
}

std::string encoder_violation(const json& body, bool chat) {
  if (!chat)
    return "encoder instances serve only /v1/chat/completions";
  PromptResult r = chat_prompt(body);
  if (!r.ok())
    return r.error;
  if (r.prompt.text_items != 0) {
    return "encoder requests must not contain text content (found " +
           std::to_string(r.prompt.text_items) + " text item(s))";
  }
  if (r.prompt.media_items != 1) {
    return "encoder requests must contain exactly one image_url/audio_url/input_audio item "
           "(found " +
           std::to_string(r.prompt.media_items) + ")";
  }
  const json* limit = nullptr;
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    if (body.contains(key) && !body[key].is_null()) {
      limit = &body[key];
      break;
    }
  }
  if (limit == nullptr || !limit->is_number_integer() || limit->get<std::int64_t>() != 1) {
    return "encoder requests must set max_tokens to 1";
  }
  if (body.contains("stream") && !body["stream"].is_null() &&
      !(body["stream"].is_boolean() && !body["stream"].get<bool>())) {
    return "encoder requests must not stream (stream must be false or absent)";
  }
  return {};
}

std::string output_token(std::size_t i) {
  static constexpr std::array<const char*, 16> kWords = {
      "the",  "quick", "brown", "fox",  "jumps", "over",  "lazy",   "dog",
      "pack", "my",    "box",   "with", "five",  "dozen", "liquor", "jugs"};
  return std::string(" ") + kWords[i % kWords.size()];
}

std::size_t continuation_offset(std::string_view text) {
  // Walk back over the words the text ends with, each the one before the
  // next in the cycle; the answer is the longest run that starts at word 0.
  // Linear in the words matched: a long prompt that does not end with
  // output costs one comparison per word of the list.
  constexpr std::size_t kCycle = 16;
  std::size_t end = text.size();
  std::optional<std::size_t> want;  // index (mod kCycle) the next word back must have
  std::size_t matched = 0;
  std::size_t best = 0;
  for (;;) {
    bool found = false;
    for (std::size_t w = 0; w < kCycle && !found; ++w) {
      if (want && w != *want)
        continue;
      const std::string word = output_token(w);
      if (end >= word.size() && text.substr(end - word.size(), word.size()) == word) {
        end -= word.size();
        ++matched;
        found = true;
        if (w == 0)
          best = matched;
        want = (w + kCycle - 1) % kCycle;
      }
    }
    if (!found)
      break;
  }
  return best;
}

std::uint32_t output_token_id(std::size_t i) {
  return 0xFFFF0000u + static_cast<std::uint32_t>(i % 16);
}

std::size_t continuation_offset(const std::vector<std::uint32_t>& ids) {
  // As for text: walk back over output ids, each the one before the next
  // in the cycle; the longest run that starts at token 0 counts.
  std::size_t matched = 0;
  std::size_t best = 0;
  std::optional<std::uint32_t> want;
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    const std::uint32_t id = *it;
    if (id < output_token_id(0) || id > output_token_id(15) || (want && id != *want))
      break;
    ++matched;
    if (id == output_token_id(0))
      best = matched;
    want = id == output_token_id(0) ? output_token_id(15) : id - 1;
  }
  return best;
}

std::string output_text(std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i)
    s += output_token(i);
  return s;
}

}  // namespace pdgate::sim
