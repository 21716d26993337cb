#include "core/pipeline/prompt_logprobs.hpp"

#include <nlohmann/json.hpp>

#include "core/base/json_body.hpp"

namespace pdgate {

namespace {

// Key order kept: the client sees decode's answer as decode wrote it,
// with only the null fields filled. Parsed whole, which is fine: only a
// request that asked for prompt_logprobs pays for it.
using ojson = nlohmann::ordered_json;

// Engine text as a JSON value, or discarded: first checked by the one
// validator (nesting up to kMaxJsonDepth), since nlohmann writes a value
// back one recursion per level and a hostile engine could nest deep enough
// to overflow the stack.
ojson parse_engine_json(std::string_view text) {
  auto valid = validate_json(text);
  if (!valid || !*valid)
    return ojson(ojson::value_t::discarded);
  return ojson::parse(text, nullptr, false);
}

}  // namespace

std::optional<std::string> prompt_logprobs_of(std::string_view answer) {
  const ojson j = parse_engine_json(answer);
  if (!j.is_object())
    return std::nullopt;
  if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
    const ojson& first = c->front();
    if (first.is_object()) {
      if (auto lp = first.find("prompt_logprobs"); lp != first.end() && lp->is_array())
        return lp->dump(-1, ' ', false, ojson::error_handler_t::replace);
    }
  }
  if (auto lp = j.find("prompt_logprobs"); lp != j.end() && lp->is_array())
    return lp->dump(-1, ' ', false, ojson::error_handler_t::replace);
  return std::nullopt;
}

std::optional<std::string> with_prompt_logprobs(std::string_view answer,
                                                std::string_view logprobs) {
  ojson j = parse_engine_json(answer);
  const ojson lp = parse_engine_json(logprobs);
  if (!j.is_object() || !lp.is_array())
    return std::nullopt;
  bool changed = false;
  const auto fill = [&](ojson& object) {
    if (auto f = object.find("prompt_logprobs"); f != object.end() && f->is_null()) {
      *f = lp;
      changed = true;
    }
  };
  fill(j);
  if (auto c = j.find("choices"); c != j.end() && c->is_array()) {
    for (ojson& choice : *c) {
      if (choice.is_object())
        fill(choice);
    }
  }
  if (!changed)
    return std::nullopt;
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

}  // namespace pdgate
