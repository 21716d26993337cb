#include "plugins/kv_event_decoder.hpp"

#include <string>
#include <string_view>

#include "plugins/msgpack_reader.hpp"

namespace pdgate {

EngineBlockHash fold_block_hash(std::span<const std::uint8_t> bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (const std::uint8_t b : bytes) {
    h ^= b;
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

#define PDGATE_TRY(var, expr) \
  auto var = (expr);          \
  if (!var)                   \
    return fail(var.error());

class Decoder {
 public:
  Decoder(std::span<const std::uint8_t> bytes, const KvDecodeLimits& limits)
      : r_(bytes), limits_(limits) {}

  Result<KvEventBatch> batch() {
    KvEventBatch out;
    PDGATE_TRY(type, r_.peek());
    if (*type == MsgType::array) {
      PDGATE_TRY(n, r_.read_array());
      if (*n < 2)
        return fail("batch: array of " + std::to_string(*n) + " items, expected ts and events");
      PDGATE_TRY(ts, r_.read_float());
      out.ts = *ts;
      if (auto e = events(out); !e)
        return fail(e.error());
      if (*n >= 3) {
        if (auto rank = optional_int(); !rank)
          return fail("data_parallel_rank: " + rank.error());
        else
          out.data_parallel_rank = *rank;
      }
      if (auto s = skip_n(*n > 3 ? *n - 3 : 0); !s)
        return fail(s.error());
    } else if (*type == MsgType::map) {
      PDGATE_TRY(n, r_.read_map());
      bool have_events = false;
      for (std::size_t i = 0; i < *n; ++i) {
        PDGATE_TRY(key, r_.read_str());
        if (*key == "ts") {
          PDGATE_TRY(ts, r_.read_float());
          out.ts = *ts;
        } else if (*key == "events") {
          if (auto e = events(out); !e)
            return fail(e.error());
          have_events = true;
        } else if (*key == "data_parallel_rank") {
          auto rank = optional_int();
          if (!rank)
            return fail("data_parallel_rank: " + rank.error());
          out.data_parallel_rank = *rank;
        } else if (auto s = r_.skip(); !s) {
          return fail(s.error());
        }
      }
      if (!have_events)
        return fail("batch: map without events");
    } else {
      return fail(std::string("batch: expected an array or a map, got ") + to_string(*type));
    }
    if (!r_.at_end())
      return fail("batch: " + std::to_string(r_.remaining()) + " bytes after the batch");
    return out;
  }

 private:
  Result<bool> skip_n(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      if (auto s = r_.skip(); !s)
        return s;
    }
    return true;
  }

  Result<std::optional<std::int64_t>> optional_int() {
    if (r_.read_nil())
      return std::optional<std::int64_t>();
    PDGATE_TRY(v, r_.read_int());
    return std::optional<std::int64_t>(*v);
  }

  Result<bool> events(KvEventBatch& out) {
    PDGATE_TRY(n, r_.read_array());
    if (*n > limits_.max_events)
      return fail("batch: " + std::to_string(*n) + " events, at most " +
                  std::to_string(limits_.max_events));
    out.events.reserve(*n);
    for (std::size_t i = 0; i < *n; ++i) {
      if (auto e = event(out); !e)
        return fail("event " + std::to_string(i) + ": " + e.error());
    }
    return true;
  }

  Result<EngineBlockHash> block_hash() {
    PDGATE_TRY(type, r_.peek());
    if (*type == MsgType::integer) {
      PDGATE_TRY(v, r_.read_int());
      return static_cast<EngineBlockHash>(*v);
    }
    PDGATE_TRY(bytes, r_.read_bytes());
    return fold_block_hash(*bytes);
  }

  Result<std::vector<EngineBlockHash>> hashes() {
    PDGATE_TRY(n, r_.read_array());
    if (*n > limits_.max_hashes)
      return fail("block_hashes: " + std::to_string(*n) + " hashes, at most " +
                  std::to_string(limits_.max_hashes));
    std::vector<EngineBlockHash> out;
    out.reserve(*n);
    for (std::size_t i = 0; i < *n; ++i) {
      PDGATE_TRY(h, block_hash());
      out.push_back(*h);
    }
    return out;
  }

  Result<std::vector<std::uint32_t>> token_ids() {
    PDGATE_TRY(n, r_.read_array());
    if (*n > limits_.max_token_ids)
      return fail("token_ids: " + std::to_string(*n) + " ids, at most " +
                  std::to_string(limits_.max_token_ids));
    std::vector<std::uint32_t> out;
    out.reserve(*n);
    for (std::size_t i = 0; i < *n; ++i) {
      PDGATE_TRY(t, r_.read_int());
      if (*t < 0 || *t > 0xffffffffll)
        return fail("token_ids: id " + std::to_string(*t) + " out of range");
      out.push_back(static_cast<std::uint32_t>(*t));
    }
    return out;
  }

  Result<std::uint32_t> block_size() {
    PDGATE_TRY(v, r_.read_int());
    if (*v <= 0 || static_cast<std::uint64_t>(*v) > limits_.max_block_size)
      return fail("block_size " + std::to_string(*v) + " out of range");
    return static_cast<std::uint32_t>(*v);
  }

  // Fields in the order of vLLM's positional layout; a map names them.
  enum class Field { block_hashes, parent, token_ids, block_size, lora_id, other };

  Result<bool> field(Field f, KvBlockStored& s, KvBlockRemoved& rm, bool stored) {
    switch (f) {
      case Field::block_hashes: {
        PDGATE_TRY(h, hashes());
        (stored ? s.block_hashes : rm.block_hashes) = std::move(*h);
        return true;
      }
      case Field::parent:
        if (r_.read_nil()) {
          s.parent.reset();
        } else {
          PDGATE_TRY(p, block_hash());
          s.parent = *p;
        }
        return true;
      case Field::token_ids: {
        PDGATE_TRY(t, token_ids());
        s.token_ids = std::move(*t);
        return true;
      }
      case Field::block_size: {
        PDGATE_TRY(b, block_size());
        s.block_size = *b;
        return true;
      }
      case Field::lora_id: {
        PDGATE_TRY(l, optional_int());
        s.lora_id = *l;
        return true;
      }
      case Field::other:
        return r_.skip();
    }
    return true;
  }

  static Field named(std::string_view key) {
    if (key == "block_hashes")
      return Field::block_hashes;
    if (key == "parent_block_hash")
      return Field::parent;
    if (key == "token_ids")
      return Field::token_ids;
    if (key == "block_size")
      return Field::block_size;
    if (key == "lora_id")
      return Field::lora_id;
    return Field::other;
  }

  Result<bool> event(KvEventBatch& out) {
    PDGATE_TRY(type, r_.peek());
    KvBlockStored s;
    KvBlockRemoved rm;
    std::string tag;
    bool have_hashes = false, have_tokens = false, have_size = false;
    if (*type == MsgType::array) {
      PDGATE_TRY(n, r_.read_array());
      if (*n == 0)
        return fail("empty event");
      PDGATE_TRY(t, r_.read_str());
      tag = std::string(*t);
      const bool stored = tag == "BlockStored";
      const bool removed = tag == "BlockRemoved";
      static constexpr Field kStored[] = {Field::block_hashes, Field::parent, Field::token_ids,
                                          Field::block_size, Field::lora_id};
      for (std::size_t i = 1; i < *n; ++i) {
        Field f = Field::other;
        if (stored && i - 1 < std::size(kStored))
          f = kStored[i - 1];
        else if (removed && i == 1)
          f = Field::block_hashes;
        if (auto ok = field(f, s, rm, stored); !ok)
          return fail(tag + ": " + ok.error());
        have_hashes |= f == Field::block_hashes;
        have_tokens |= f == Field::token_ids;
        have_size |= f == Field::block_size;
      }
    } else if (*type == MsgType::map) {
      PDGATE_TRY(n, r_.read_map());
      // The tag may come after the fields: read them for both kinds and
      // keep what the tag asks for.
      for (std::size_t i = 0; i < *n; ++i) {
        PDGATE_TRY(key, r_.read_str());
        if (*key == "type") {
          PDGATE_TRY(t, r_.read_str());
          tag = std::string(*t);
          continue;
        }
        const Field f = named(*key);
        // Hashes go to both kinds until the tag is known.
        if (auto ok = field(f, s, rm, true); !ok)
          return fail(std::string(*key) + ": " + ok.error());
        have_hashes |= f == Field::block_hashes;
        have_tokens |= f == Field::token_ids;
        have_size |= f == Field::block_size;
      }
      if (tag == "BlockRemoved")
        rm.block_hashes = std::move(s.block_hashes);
      if (tag.empty())
        return fail("event map without a type");
    } else {
      return fail(std::string("expected an array or a map, got ") + to_string(*type));
    }

    if (tag == "BlockStored") {
      if (!have_hashes || !have_tokens || !have_size)
        return fail("BlockStored without block_hashes, token_ids or block_size");
      if (s.token_ids.size() != s.block_hashes.size() * s.block_size)
        return fail("BlockStored: " + std::to_string(s.token_ids.size()) + " token ids for " +
                    std::to_string(s.block_hashes.size()) + " blocks of " +
                    std::to_string(s.block_size));
      out.events.emplace_back(std::move(s));
    } else if (tag == "BlockRemoved") {
      if (!have_hashes)
        return fail("BlockRemoved without block_hashes");
      out.events.emplace_back(std::move(rm));
    } else if (tag == "AllBlocksCleared") {
      out.events.emplace_back(KvAllBlocksCleared{});
    } else {
      ++out.unknown_events;
    }
    return true;
  }

  MsgpackReader r_;
  const KvDecodeLimits& limits_;
};

#undef PDGATE_TRY

}  // namespace

Result<KvEventBatch> decode_kv_event_batch(std::span<const std::uint8_t> payload,
                                           const KvDecodeLimits& limits) {
  if (payload.size() > limits.max_bytes)
    return fail("batch: " + std::to_string(payload.size()) + " bytes, at most " +
                std::to_string(limits.max_bytes));
  return Decoder(payload, limits).batch();
}

}  // namespace pdgate
