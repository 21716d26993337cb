#include "plugins/kv_event_decoder.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
      : bytes_(bytes), r_(bytes), limits_(limits) {}

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
        auto rank = dp_rank();
        if (!rank)
          return fail("data_parallel_rank: " + rank.error());
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
          auto rank = dp_rank();
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

  Result<std::optional<std::int64_t>> dp_rank() {
    PDGATE_TRY(v, optional_int());
    if (*v && (**v < 0 || **v > limits_.max_dp_rank))
      return fail(std::to_string(**v) + " out of range");
    return *v;
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

  Result<std::optional<std::string>> optional_string() {
    if (r_.read_nil())
      return std::optional<std::string>();
    PDGATE_TRY(v, r_.read_str());
    if (v->size() > limits_.max_string)
      return fail("string of " + std::to_string(v->size()) + " bytes, at most " +
                  std::to_string(limits_.max_string));
    return std::optional<std::string>(std::string(*v));
  }

  Result<std::optional<std::uint32_t>> optional_group() {
    PDGATE_TRY(v, optional_int());
    if (!*v)
      return std::optional<std::uint32_t>();
    if (**v < 0 || **v > limits_.max_group_idx)
      return fail("group_idx " + std::to_string(**v) + " out of range");
    return std::optional<std::uint32_t>(static_cast<std::uint32_t>(**v));
  }

  // extra_keys: nil, or one entry per block, each nil or a tuple. Kept raw
  // here (spans into the payload) and hashed once the whole event is read,
  // since the LoRA name they repeat may come after them in a map.
  Result<bool> extra_keys_raw() {
    extra_raw_.clear();
    have_extra_ = false;
    if (r_.read_nil())
      return true;
    PDGATE_TRY(n, r_.read_array());
    if (*n > limits_.max_hashes)
      return fail("extra_keys: " + std::to_string(*n) + " entries, at most " +
                  std::to_string(limits_.max_hashes));
    extra_raw_.reserve(*n);
    for (std::size_t i = 0; i < *n; ++i) {
      const std::size_t from = r_.position();
      if (auto s = r_.skip(); !s)
        return fail("extra_keys: " + s.error());
      extra_raw_.push_back(bytes_.subspan(from, r_.position() - from));
    }
    have_extra_ = true;
    return true;
  }

  // One block's extra keys as a hash: 0 when they name nothing but the
  // block's own LoRA adapter (which the index keys by already). The entry
  // was skipped whole once, so it is well formed and complete.
  static std::uint64_t extra_hash(std::span<const std::uint8_t> raw,
                                  const std::optional<std::string>& lora) {
    MsgpackReader r(raw);
    if (r.read_nil())
      return 0;
    const auto n = r.read_array();
    if (!n)  // not a tuple: opaque, but still a key the tokens do not give
      return fold_block_hash(raw) | 1;
    std::uint64_t h = 0;
    for (std::size_t i = 0; i < *n; ++i) {
      const std::size_t from = r.position();
      if (const auto str = r.read_str()) {
        if (lora && *str == *lora)
          continue;
      } else if (!r.skip()) {
        return fold_block_hash(raw) | 1;
      }
      h = (h * 1099511628211ull) ^ fold_block_hash(raw.subspan(from, r.position() - from));
    }
    return h == 0 ? 0 : (h | 1);
  }

  // Fields in the order of vLLM's positional layout; a map names them.
  enum class Field {
    block_hashes,
    parent,
    token_ids,
    block_size,
    lora_id,
    medium,
    lora_name,
    extra_keys,
    group_idx,
    spec_kind,
    sliding_window,
    other
  };

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
      case Field::medium: {
        PDGATE_TRY(m, optional_string());
        (stored ? s.medium : rm.medium) = std::move(*m);
        return true;
      }
      case Field::lora_name: {
        PDGATE_TRY(l, optional_string());
        s.lora_name = std::move(*l);
        return true;
      }
      case Field::extra_keys:
        return extra_keys_raw();
      case Field::group_idx: {
        PDGATE_TRY(g, optional_group());
        (stored ? s.group_idx : rm.group_idx) = *g;
        return true;
      }
      case Field::spec_kind: {
        PDGATE_TRY(k, optional_string());
        s.kv_cache_spec_kind = std::move(*k);
        return true;
      }
      case Field::sliding_window: {
        // Read for its type only: the index keeps no sliding-window blocks.
        PDGATE_TRY(w, optional_int());
        if (*w && **w < 0)
          return fail("kv_cache_spec_sliding_window " + std::to_string(**w) + " out of range");
        return true;
      }
      case Field::other:
        return r_.skip();
    }
    return true;
  }

  static Field named(std::string_view key) {
    static constexpr std::pair<std::string_view, Field> kNames[] = {
        {"block_hashes", Field::block_hashes},
        {"parent_block_hash", Field::parent},
        {"token_ids", Field::token_ids},
        {"block_size", Field::block_size},
        {"lora_id", Field::lora_id},
        {"medium", Field::medium},
        {"lora_name", Field::lora_name},
        {"extra_keys", Field::extra_keys},
        {"group_idx", Field::group_idx},
        {"kv_cache_spec_kind", Field::spec_kind},
        {"kv_cache_spec_sliding_window", Field::sliding_window},
    };
    for (const auto& [name, f] : kNames) {
      if (key == name)
        return f;
    }
    return Field::other;
  }

  // vLLM's field order (BlockStored, BlockRemoved), for positional events.
  static Field positional(std::string_view tag, std::size_t i) {
    static constexpr Field kStored[] = {Field::block_hashes, Field::parent,        Field::token_ids,
                                        Field::block_size,   Field::lora_id,       Field::medium,
                                        Field::lora_name,    Field::extra_keys,    Field::group_idx,
                                        Field::spec_kind,    Field::sliding_window};
    static constexpr Field kRemoved[] = {Field::block_hashes, Field::medium, Field::group_idx};
    if (tag == "BlockStored" && i < std::size(kStored))
      return kStored[i];
    if (tag == "BlockRemoved" && i < std::size(kRemoved))
      return kRemoved[i];
    return Field::other;
  }

  static bool known_tag(std::string_view tag) {
    return tag == "BlockStored" || tag == "BlockRemoved" || tag == "AllBlocksCleared";
  }

  Result<bool> event(KvEventBatch& out) {
    PDGATE_TRY(type, r_.peek());
    KvBlockStored s;
    KvBlockRemoved rm;
    std::string tag;
    bool have_hashes = false, have_tokens = false, have_size = false;
    extra_raw_.clear();
    have_extra_ = false;
    const auto note = [&](Field f) {
      have_hashes |= f == Field::block_hashes;
      have_tokens |= f == Field::token_ids;
      have_size |= f == Field::block_size;
    };
    if (*type == MsgType::array) {
      PDGATE_TRY(n, r_.read_array());
      if (*n == 0)
        return fail("empty event");
      PDGATE_TRY(t, r_.read_str());
      tag = std::string(*t);
      const bool stored = tag == "BlockStored";
      for (std::size_t i = 1; i < *n; ++i) {
        const Field f = positional(tag, i - 1);
        if (auto ok = field(f, s, rm, stored); !ok)
          return fail(tag + ": " + ok.error());
        note(f);
      }
    } else if (*type == MsgType::map) {
      PDGATE_TRY(n, r_.read_map());
      // The tag may come after the fields: read them for both kinds and
      // keep what the tag asks for. Once a tag this version does not know
      // is read (msgspec writes it first), its fields are skipped unread.
      for (std::size_t i = 0; i < *n; ++i) {
        PDGATE_TRY(key, r_.read_str());
        if (*key == "type") {
          PDGATE_TRY(t, r_.read_str());
          tag = std::string(*t);
          continue;
        }
        const Field f = tag.empty() || known_tag(tag) ? named(*key) : Field::other;
        // Hashes, medium and group go to both kinds until the tag is known.
        if (auto ok = field(f, s, rm, true); !ok)
          return fail(std::string(*key) + ": " + ok.error());
        note(f);
      }
      if (tag == "BlockRemoved") {
        rm.block_hashes = std::move(s.block_hashes);
        rm.medium = std::move(s.medium);
        rm.group_idx = s.group_idx;
      }
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
      if (have_extra_) {
        if (extra_raw_.size() != s.block_hashes.size())
          return fail("BlockStored: " + std::to_string(extra_raw_.size()) + " extra_keys for " +
                      std::to_string(s.block_hashes.size()) + " blocks");
        s.extra_keys.reserve(extra_raw_.size());
        bool any = false;
        for (const auto raw : extra_raw_) {
          s.extra_keys.push_back(extra_hash(raw, s.lora_name));
          any |= s.extra_keys.back() != 0;
        }
        if (!any)
          s.extra_keys.clear();  // nothing beyond the tokens: as if none were sent
      }
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

  std::span<const std::uint8_t> bytes_;
  MsgpackReader r_;
  const KvDecodeLimits& limits_;
  // The event being read: its extra_keys entries, raw.
  std::vector<std::span<const std::uint8_t>> extra_raw_;
  bool have_extra_ = false;
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
