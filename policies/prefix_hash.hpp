// Prefix block hashes: the prompt text cut into fixed-size blocks, each
// block's hash chained to the one before it, so equal hashes at position i
// mean (almost certainly) equal text up to the end of block i. Policies
// compare these to find where a request's prefix was routed before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace pdgate::policy {

// A 64-bit hash in the xxHash64 family (four 64-bit lanes, 32 bytes per
// round), written here so the gateway takes no new library. It is not
// cryptographic: a user who controls prompts can force collisions, which at
// worst routes their own request to a worse instance.
std::uint64_t hash64(std::string_view data, std::uint64_t seed = 0);

// Hashes of every full `block_bytes` block of `text`, chained; the partial
// tail is left out, as engines cache only full blocks. Values are masked to
// 53 bits so Lua numbers (doubles) hold them exactly and can use them as
// table keys.
std::vector<std::uint64_t> prefix_block_hashes(std::string_view text, std::size_t block_bytes);

inline constexpr std::uint64_t kLuaExactMask = (std::uint64_t{1} << 53) - 1;

}  // namespace pdgate::policy
