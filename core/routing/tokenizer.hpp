// Turns a request's prompt into the token ids an engine would see, so the
// exact KV-block index (core/routing/kv_block_index.hpp) can be asked which engine
// holds its leading blocks. Implementations are in plugins/ (the sim's
// rule, plugins/sim_tokenizer.hpp); `--tokenizer none` has none, and
// policies then get no exact data (docs/kv-events.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace pdgate {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // `prompt_raw` is the raw JSON of the request's `prompt` (completions) or
  // `messages` (chat). Nothing when it cannot be tokenized: the request
  // then simply has no exact data. Called inside a pick: never blocks.
  virtual std::optional<std::vector<std::uint32_t>> token_ids(
      bool chat, std::string_view prompt_raw) const = 0;
};

}  // namespace pdgate
