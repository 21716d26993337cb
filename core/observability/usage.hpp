// The token counts an engine reports in its answer's `usage` member: the
// last one in a stretch of SSE events (a stream asked with
// stream_options.include_usage ends with an event carrying it), or in a
// whole answer's body. Found by a search from the end, without parsing the
// text around it: vLLM writes `usage` last.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/observability/metrics.hpp"

namespace pdgate {

// The last `"usage": {...}` member in `text` with non-negative integer
// prompt_tokens and completion_tokens (or, as the Responses API has them,
// input_tokens and output_tokens); nullopt when there is none, or the
// last one is null or malformed.
// `in_events`: `text` is SSE events, where a data line never holds a line
// break, so an object broken by one is cut off (it must not be completed
// by whatever follows the complete events).
std::optional<TokenUsage> last_usage(std::string_view text, bool in_events = false);

// usage.prompt_tokens_details.cached_tokens of a whole JSON answer (vLLM
// reports it with --enable-prompt-tokens-details, and leaves the details
// out when it is 0): 0 when the usage has no details; nullopt without a
// usage object or when the count is not a non-negative integer.
std::optional<std::uint64_t> prompt_cached_tokens(std::string_view answer);

// `object` (a whole answer, or an SSE event's data) with its top-level
// usage's prompt_tokens_details set to {"cached_tokens": cached}, every
// other byte kept; nullopt when it is not a JSON object whose usage object
// has non-null details (nothing to change).
std::optional<std::string> with_cached_tokens(std::string_view object, std::uint64_t cached);

}  // namespace pdgate
