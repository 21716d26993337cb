// The request hook of policy API v2 (docs/policies.md, "on_request"): what
// a policy sees of a request before it is routed, and what it may decide
// about it. The pipeline fills the input and applies the decision
// (core/pipeline/request_hook_phase.cpp); the policy engine runs the script. The
// checks and edits here are pure, so both sides share them and unit tests
// cover them without a gateway.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/json_body.hpp"
#include "core/routing/request_facts.hpp"

namespace pdgate {

struct ClientKey;

// How the request reaches its engines.
enum class RoutePath {
  configured,  // as the connector and --prefill-disabled say (the default)
  pd,          // prefill, then decode with the KV cache handed over
  one_hop,     // decode only: it prefills the prompt itself
};
const char* to_string(RoutePath p);

struct RequestHookInput {
  std::string_view request_id;
  std::string_view body;  // the client's JSON object, validated
  const JsonObjectIndex* index = nullptr;
  bool is_chat = false;
  std::string_view model;
  bool stream = false;
  std::size_t prompt_bytes = 0;  // raw `messages` / `prompt` JSON
  // The client's request headers but its credentials, as PickContext
  // lists them (names lower-case).
  using HeaderEmit = void (*)(void* user, std::string_view name, std::string_view value);
  void (*for_each_header)(const void* source, void* user, HeaderEmit emit) = nullptr;
  const void* header_source = nullptr;
  // The client's API key (--api-keys), null when keys are off.
  const ClientKey* key = nullptr;
  // PickContext::serial: the hook's req.vars is the picks' ctx.vars.
  std::uint64_t serial = 0;
};

// An upstream header to set (value) or remove (no value).
struct HeaderEdit {
  std::string name;  // lower-case
  std::optional<std::string> value;
};

// A limit the request hook declared (req:rate_limit, docs/policies.md):
// the request counts as one event under `key`, and is refused (429 with
// Retry-After) when `limit` events already fell in the last `window_ms`.
// The hook only declares it; the pipeline checks and counts every limit
// of the request together after the hook (core/pipeline/rate_limit_phase.hpp),
// with --redis on Redis's clock for every replica, without on this
// replica's shared store. A hook never waits for I/O.
struct RateLimitDecl {
  std::string key;
  std::int64_t limit = 0;
  std::int64_t window_ms = 0;
  std::string message;  // the 429's message; empty: the gateway's
};
// How one declared limit stands: whether one more event fits, the events
// in the window (this one included when it fits and is counted), and,
// when it does not fit, the milliseconds until the oldest event that must
// leave the window does.
struct RateLimitAnswer {
  bool allowed = false;
  std::int64_t count = 0;
  std::int64_t retry_after_ms = 0;
};
// Bounds on declared limits: a few per request, a key short enough to
// name a Redis key, a limit and window as pdgate.rate takes them.
inline constexpr std::size_t kMaxRateLimitsPerRequest = 4;
inline constexpr std::size_t kMaxRateLimitKeyBytes = 200;
inline constexpr std::int64_t kMaxRateLimitEvents = 100000;
inline constexpr std::int64_t kMaxRateLimitWindowMs = 31536000000;

struct RequestDecision {
  // Non-zero: the request is answered with this status (400..599) and
  // message and goes no further, with these response headers (checked by
  // refusal_header_error).
  unsigned reject_status = 0;
  std::string reject_message;
  std::vector<std::pair<std::string, std::string>> reject_headers;
  std::vector<HeaderEdit> headers;
  // Caps max_tokens (and a chat's max_completion_tokens); set when absent.
  std::optional<std::int64_t> max_tokens_cap;
  std::optional<std::int64_t> priority;
  RoutePath path = RoutePath::configured;
  // Limits to check and count once the hook has run (at most
  // kMaxRateLimitsPerRequest).
  std::vector<RateLimitDecl> rate_limits;
  // The hook failed (error, budget, a bad answer) and its policy is
  // fail-closed: 503. `error` says why (operators only).
  bool failed_closed = false;
  std::string error;
};

// Bounds on what one request's hook may edit.
constexpr std::size_t kMaxHeaderEdits = 16;
constexpr std::size_t kMaxHeaderNameBytes = 64;
constexpr std::size_t kMaxHeaderValueBytes = 1024;

// Why a policy may not set (or remove) this upstream header, or nothing
// when it may: a token name within the bounds, not hop-by-hop, not one
// pdgate writes itself (Host, X-Request-Id, Authorization, tracing and
// forwarding headers, X-Pdgate-*), a value without control characters.
// `value` null: a removal.
std::optional<std::string> header_edit_error(std::string_view name,
                                             const std::string* value = nullptr);

// Bounds on the response headers a policy's refusal may carry.
constexpr std::size_t kMaxRefusalHeaders = 8;
constexpr std::size_t kMaxRefusalValueBytes = 256;

// Why a policy's refusal may not carry this response header, or nothing
// when it may: Retry-After, or an x-* name (not x-request-id, not
// x-pdgate-*), a token within kMaxHeaderNameBytes, a value within
// kMaxRefusalValueBytes without control characters.
std::optional<std::string> refusal_header_error(std::string_view name, std::string_view value);

// The body the engines get after the hook's field edits (max_tokens cap,
// priority), or nothing when the decision edits no field or changes
// nothing. A member that is not a number is left for the engine to refuse.
// (max_output_tokens for /v1/responses, which reads no other limit).
std::optional<std::string> hooked_body(std::string_view body, const JsonObjectIndex& index,
                                       GenerationApi api, const RequestDecision& d);
inline std::optional<std::string> hooked_body(std::string_view body, const JsonObjectIndex& index,
                                              bool is_chat, const RequestDecision& d) {
  return hooked_body(body, index, is_chat ? GenerationApi::chat : GenerationApi::completions, d);
}

// The prompt's size in tokens as the request hook and conditional_pd
// estimate it: 4 bytes of raw prompt JSON per token, rounded up. (English
// text runs ~4 characters per token in common BPE vocabularies; JSON
// quoting adds a little, which errs towards a larger prompt.)
std::size_t estimated_prompt_tokens(std::size_t prompt_bytes);

}  // namespace pdgate
