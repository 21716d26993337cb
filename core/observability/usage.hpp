// The token counts an engine reports in its answer's `usage` member: the
// last one in a stretch of SSE events (a stream asked with
// stream_options.include_usage ends with an event carrying it), or in a
// whole answer's body. Found by a search from the end, without parsing the
// text around it: vLLM writes `usage` last.
#pragma once

#include <optional>
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

}  // namespace pdgate
