// The tokenizer of pdgate-sim: its own prompt rules (sim/tokenizer.hpp,
// linked, not copied), so the ids pdgate computes for a request are the
// ids a sim reports in its KV events. For tests and demos; real vLLM
// engines need their model's tokenizer.
#pragma once

#include "core/routing/tokenizer.hpp"

namespace pdgate {

class SimTokenizer final : public Tokenizer {
 public:
  std::optional<std::vector<std::uint32_t>> token_ids(bool chat,
                                                      std::string_view prompt_raw) const override;
};

}  // namespace pdgate
