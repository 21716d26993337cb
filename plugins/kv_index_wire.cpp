#include "plugins/kv_index_wire.hpp"

#include "plugins/wire_bytes.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

namespace pdgate::kv_wire {
namespace {

using wire::put;
using wire::Reader;

constexpr char kMagic[4] = {'p', 'd', 'k', '1'};
constexpr std::uint8_t kPrefix = 1;
constexpr std::uint8_t kConversation = 2;

}  // namespace

std::size_t append_prefix(std::string& out, InstanceKey instance, std::int64_t wall_ms,
                          const std::vector<std::uint64_t>& hashes) {
  const std::size_t before = out.size();
  const std::size_t n = std::min(hashes.size(), kMaxBlocks);
  out.reserve(out.size() + 21 + 8 * n);
  put<std::uint8_t>(out, kPrefix);
  put<std::uint64_t>(out, instance);
  put<std::int64_t>(out, wall_ms);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(n));
  // Records are encoded on the pick path: one copy of the hashes where
  // the machine is little-endian, byte by byte elsewhere.
  if constexpr (std::endian::native == std::endian::little) {
    // (memcpy from an empty vector's null data() is undefined, even for 0 bytes.)
    if (n > 0) {
      const std::size_t at = out.size();
      out.resize(at + 8 * n);
      std::memcpy(out.data() + at, hashes.data(), 8 * n);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i)
      put<std::uint64_t>(out, hashes[i]);
  }
  return out.size() - before;
}

std::size_t append_conversation(std::string& out, std::string_view id, InstanceKey decode,
                                InstanceKey prefill, std::int64_t wall_ms) {
  const std::size_t before = out.size();
  id = id.substr(0, kMaxConversationId);
  put<std::uint8_t>(out, kConversation);
  put<std::uint64_t>(out, decode);
  put<std::uint64_t>(out, prefill);
  put<std::int64_t>(out, wall_ms);
  put<std::uint16_t>(out, static_cast<std::uint16_t>(id.size()));
  out.append(id);
  return out.size() - before;
}

std::string header(std::uint64_t origin) {
  std::string h(kMagic, sizeof(kMagic));
  put<std::uint64_t>(h, origin);
  return h;
}

Result<Batch> decode_batch(std::string_view bytes) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return fail("not a kv-index batch (bad magic)");
  Reader r(bytes.substr(sizeof(kMagic)));
  Batch b;
  b.origin = r.get<std::uint64_t>();
  while (r.left() > 0) {
    const auto kind = r.get<std::uint8_t>();
    if (kind == kPrefix) {
      PrefixRecord p;
      p.instance = r.get<std::uint64_t>();
      p.wall_ms = r.get<std::int64_t>();
      const auto n = r.get<std::uint32_t>();
      // Checked against the bytes left before allocating for them.
      if (r.bad() || n > kMaxBlocks || r.left() / 8 < n)
        return fail("kv-index batch: bad prefix record");
      p.hashes.resize(n);
      if constexpr (std::endian::native == std::endian::little) {
        const std::string_view raw = r.bytes(8 * std::size_t{n});
        if (n > 0)
          std::memcpy(p.hashes.data(), raw.data(), raw.size());
      } else {
        for (auto& h : p.hashes)
          h = r.get<std::uint64_t>();
      }
      b.prefixes.push_back(std::move(p));
    } else if (kind == kConversation) {
      ConversationRecord c;
      c.decode = r.get<std::uint64_t>();
      c.prefill = r.get<std::uint64_t>();
      c.wall_ms = r.get<std::int64_t>();
      const auto len = r.get<std::uint16_t>();
      if (len > kMaxConversationId)
        return fail("kv-index batch: conversation id too long");
      c.id = std::string(r.bytes(len));
      if (r.bad())
        return fail("kv-index batch: truncated conversation record");
      b.conversations.push_back(std::move(c));
    } else {
      return fail("kv-index batch: unknown record kind " + std::to_string(kind));
    }
  }
  return b;
}

Result<std::vector<StreamEntry>> parse_xread(const RedisReply& reply, std::string_view field) {
  using T = RedisReply::Type;
  std::vector<StreamEntry> out;
  if (reply.type == T::nil)
    return out;
  if (reply.type != T::array)
    return fail("XREAD: " + (reply.text.empty() ? std::string("unexpected reply") : reply.text));
  for (const RedisReply& stream : reply.elements) {
    // [key, [[id, [field, value, ...]], ...]]
    if (stream.type != T::array || stream.elements.size() != 2 ||
        stream.elements[1].type != T::array)
      return fail("XREAD: malformed stream");
    for (const RedisReply& entry : stream.elements[1].elements) {
      if (entry.type != T::array || entry.elements.size() != 2 ||
          entry.elements[0].type != T::string)
        return fail("XREAD: malformed entry");
      // Every entry's id is kept, payload or not, so the reader moves past it.
      StreamEntry& e = out.emplace_back();
      e.id = entry.elements[0].text;
      const RedisReply& fields = entry.elements[1];
      if (fields.type != T::array)
        continue;  // a trimmed-away entry may come back with nil fields
      for (std::size_t i = 0; i + 1 < fields.elements.size(); i += 2) {
        if (fields.elements[i].type == T::string && fields.elements[i].text == field &&
            fields.elements[i + 1].type == T::string) {
          e.payload = fields.elements[i + 1].text;
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace pdgate::kv_wire
