#include "core/routing/request_facts.hpp"

#include <utility>

namespace pdgate {
namespace {

bool is_null(std::string_view raw) {
  return raw == "null";
}

// The first byte of a validated raw value tells its type.
char kind(std::string_view raw) {
  return raw.empty() ? '\0' : raw.front();
}
bool is_number(std::string_view raw) {
  const char c = kind(raw);
  return c == '-' || (c >= '0' && c <= '9');
}

// A token limit: absent or null is none; otherwise a whole number of at
// least 1 however written (vLLM refuses the rest, and a cap or a token
// budget must never let through a value it could not read).
Result<std::optional<std::int64_t>> token_limit(std::string_view body, const JsonObjectIndex& index,
                                                std::string_view key) {
  const auto raw = raw_member(body, index, key);
  if (!raw || is_null(*raw))
    return std::optional<std::int64_t>();
  const auto n = integral_value(*raw);
  if (!n)
    return fail("'" + std::string(key) + "' must be an integer");
  if (*n < 1)
    return fail("'" + std::string(key) + "' must be at least 1, got " + std::to_string(*n));
  return std::optional<std::int64_t>(*n);
}

}  // namespace

std::string_view prompt_member(GenerationApi api) {
  switch (api) {
    case GenerationApi::chat:
      return "messages";
    case GenerationApi::responses:
      return "input";
    case GenerationApi::completions:
      break;
  }
  return "prompt";
}

Result<RequestFacts> read_facts(std::string_view body, const JsonObjectIndex& index,
                                GenerationApi api) {
  RequestFacts f;
  const bool is_chat = api == GenerationApi::chat;
  f.is_chat = is_chat;

  if (const auto model = raw_member(body, index, "model"); model && !is_null(*model)) {
    auto decoded = kind(*model) == '"' ? decode_json_string(*model) : std::nullopt;
    if (!decoded)
      return fail("'model' must be a string");
    f.model = std::move(*decoded);
  }

  if (const auto stream = raw_member(body, index, "stream"); stream && !is_null(*stream)) {
    const auto b = bool_member(body, index, "stream");
    if (!b)
      return fail("'stream' must be a boolean");
    f.stream = *b;
  }

  if (const auto so = raw_member(body, index, "stream_options"); so && !is_null(*so)) {
    if (kind(*so) != '{')
      return fail("'stream_options' must be an object");
    // stream_options is a small object inside an already validated body,
    // so indexing it again cannot fail and costs next to nothing.
    const auto inner = index_json_object(*so);
    if (!inner)
      return fail("'stream_options': " + inner.error());
    const auto usage = raw_member(*so, *inner, "include_usage");
    if (usage && !is_null(*usage)) {
      const auto b = bool_member(*so, *inner, "include_usage");
      if (!b)
        return fail("'stream_options.include_usage' must be a boolean");
      f.include_usage = *b;
    }
  }

  if (const auto cid = raw_member(body, index, "conversation_id"); cid && !is_null(*cid)) {
    if (kind(*cid) == '"') {
      f.conversation_id = decode_json_string(*cid);
    } else if (is_number(*cid)) {
      f.conversation_id = std::string(*cid);
    } else {
      return fail("'conversation_id' must be a string");
    }
  }

  if (api == GenerationApi::responses) {
    // vLLM's ResponsesRequest: `input` is required, a string or a list of
    // items; max_output_tokens is its only output limit.
    const auto input = raw_member(body, index, "input");
    if (!input || (kind(*input) != '"' && kind(*input) != '['))
      return fail("'input' is required and must be a string or a list of input items");
    f.prompt_bytes = input->size();
    auto most = token_limit(body, index, "max_output_tokens");
    if (!most)
      return fail(most.error());
    f.max_output_tokens = *most;
    // A background response answers at once, queued, and is fetched later
    // from the engine that holds it (GET /v1/responses/{id}): neither has
    // a prefill leg, nor a route through the gateway.
    if (const auto bg = raw_member(body, index, "background"); bg && *bg == "true")
      return fail("'background' responses are not supported through the gateway");
    if (const auto prev = raw_member(body, index, "previous_response_id");
        prev && !is_null(*prev)) {
      auto id = kind(*prev) == '"' ? decode_json_string(*prev) : std::nullopt;
      if (!id)
        return fail("'previous_response_id' must be a string");
      f.previous_response_id = std::move(*id);
    }
    return f;
  }

  auto max_tokens = token_limit(body, index, "max_tokens");
  if (!max_tokens)
    return fail(max_tokens.error());
  f.max_tokens = *max_tokens;
  if (is_chat) {
    auto max_completion = token_limit(body, index, "max_completion_tokens");
    if (!max_completion)
      return fail(max_completion.error());
    f.max_completion_tokens = *max_completion;
  }

  if (const auto prompt = raw_member(body, index, prompt_member(api))) {
    f.prompt_bytes = prompt->size();
  }
  return f;
}

}  // namespace pdgate
