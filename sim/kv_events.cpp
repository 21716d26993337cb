#include "sim/kv_events.hpp"

#include <charconv>

#include <nlohmann/json.hpp>

#include "sim/msgpack_writer.hpp"
#include "sim/tokenizer.hpp"

namespace pdgate::sim {

using nlohmann::json;

namespace {

std::string parse_into(const json& j, KvEventsConfig& c) {
  auto want_uint = [&](const std::string& key, const json& v, std::size_t& dst,
                       std::size_t min) -> std::string {
    if (!v.is_number_integer() || v.get<std::int64_t>() < static_cast<std::int64_t>(min))
      return "'" + key + "' must be an integer >= " + std::to_string(min);
    dst = v.get<std::size_t>();
    return {};
  };
  auto want_string = [&](const std::string& key, const json& v, std::string& dst) -> std::string {
    if (!v.is_string())
      return "'" + key + "' must be a string";
    dst = v.get<std::string>();
    return {};
  };
  bool publisher_given = false;
  for (const auto& [key, v] : j.items()) {
    std::string err;
    if (key == "enable_kv_cache_events") {
      if (!v.is_boolean())
        return "'enable_kv_cache_events' must be a boolean";
      c.enabled = v.get<bool>();
    } else if (key == "publisher") {
      err = want_string(key, v, c.publisher);
      publisher_given = true;
    } else if (key == "endpoint") {
      err = want_string(key, v, c.endpoint);
    } else if (key == "replay_endpoint") {
      if (!v.is_null())
        err = want_string(key, v, c.replay_endpoint);
    } else if (key == "buffer_steps") {
      err = want_uint(key, v, c.buffer_steps, 1);
    } else if (key == "hwm") {
      std::size_t hwm = 0;
      err = want_uint(key, v, hwm, 0);
      if (err.empty() && hwm > 0x7fffffff)
        err = "'hwm' is too large";
      c.hwm = static_cast<int>(hwm);
    } else if (key == "max_queue_size") {
      err = want_uint(key, v, c.max_queue_size, 1);
    } else if (key == "topic") {
      err = want_string(key, v, c.topic);
    } else {
      return "unknown key '" + key +
             "' (expected enable_kv_cache_events, publisher, endpoint, replay_endpoint, "
             "buffer_steps, hwm, max_queue_size, topic)";
    }
    if (!err.empty())
      return err;
  }
  if (!publisher_given && c.enabled)
    c.publisher = "zmq";
  if (c.publisher != "zmq" && c.publisher != "null")
    return "'publisher' must be \"zmq\" or \"null\" (got \"" + c.publisher + "\")";
  if (c.enabled && c.publisher == "zmq" && c.endpoint.empty())
    return "'endpoint' must not be empty";
  return {};
}

void write_hash(MsgpackWriter& w, std::uint64_t h, HashKind kind) {
  if (kind == HashKind::integer) {
    w.uinteger(h);
  } else {
    w.bin(hash_bytes(h));
  }
}

void write_hashes(MsgpackWriter& w, const std::vector<std::uint64_t>& hs, HashKind kind) {
  w.array(static_cast<std::uint32_t>(hs.size()));
  for (std::uint64_t h : hs)
    write_hash(w, h, kind);
}

// Event fields are named in the map and vllm layouts, positional in array.
bool named_fields(EventLayout layout) {
  return layout != EventLayout::array;
}

// One field: its name first when fields are named, nothing extra otherwise.
void field(MsgpackWriter& w, EventLayout layout, std::string_view name) {
  if (named_fields(layout))
    w.str(name);
}

// An event's container and its type tag: positional element 0, or the
// "type" key. `fields` counts the tag.
void open_event(MsgpackWriter& w, EventLayout layout, std::uint32_t fields, std::string_view type) {
  named_fields(layout) ? w.map(fields) : w.array(fields);
  field(w, layout, "type");
  w.str(type);
}

void optional_str(MsgpackWriter& w, std::string_view s) {
  if (s.empty()) {
    w.nil();
  } else {
    w.str(s);
  }
}

void write_event(MsgpackWriter& w, const KvEvent& e, EventLayout layout, HashKind kind) {
  // The fields vLLM added after lora_name (msgspec omits a None default:
  // kv_cache_spec_sliding_window is sent for sliding-window groups only).
  const bool extended = named_fields(layout);
  if (const auto* s = std::get_if<BlockStored>(&e)) {
    const bool window = s->group.kind == "sliding_window";
    open_event(w, layout, extended ? 11u + window : 8u, "BlockStored");
    field(w, layout, "block_hashes");
    write_hashes(w, s->block_hashes, kind);
    field(w, layout, "parent_block_hash");
    if (s->parent_block_hash) {
      write_hash(w, *s->parent_block_hash, kind);
    } else {
      w.nil();
    }
    field(w, layout, "token_ids");
    w.array(static_cast<std::uint32_t>(s->token_ids.size()));
    for (std::uint32_t t : s->token_ids)
      w.uinteger(t);
    field(w, layout, "block_size");
    w.uinteger(s->block_size);
    field(w, layout, "lora_id");
    if (s->lora_name.empty()) {
      w.nil();
    } else {
      w.integer(s->lora_id);
    }
    field(w, layout, "medium");
    w.str("GPU");
    field(w, layout, "lora_name");
    optional_str(w, s->lora_name);
    if (!extended)
      return;
    // One entry per block: the keys besides its tokens, here the adapter's
    // name (vLLM's generate_block_hash_extra_keys), else None.
    field(w, layout, "extra_keys");
    w.array(static_cast<std::uint32_t>(s->block_hashes.size()));
    for (std::size_t i = 0; i < s->block_hashes.size(); ++i) {
      if (s->lora_name.empty()) {
        w.nil();
      } else {
        w.array(1);
        w.str(s->lora_name);
      }
    }
    field(w, layout, "group_idx");
    w.uinteger(s->group.idx);
    field(w, layout, "kv_cache_spec_kind");
    w.str(s->group.kind);
    if (window) {
      field(w, layout, "kv_cache_spec_sliding_window");
      w.uinteger(4 * s->block_size);
    }
  } else if (const auto* r = std::get_if<BlockRemoved>(&e)) {
    open_event(w, layout, extended ? 4 : 3, "BlockRemoved");
    field(w, layout, "block_hashes");
    write_hashes(w, r->block_hashes, kind);
    field(w, layout, "medium");
    w.str("GPU");
    if (extended) {
      field(w, layout, "group_idx");
      w.uinteger(r->group_idx);
    }
  } else {
    open_event(w, layout, 1, "AllBlocksCleared");
  }
}

}  // namespace

KvEventsConfigParse parse_kv_events_config(std::string_view json_text) {
  KvEventsConfigParse out;
  const json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    out.error = "expects a JSON object";
    return out;
  }
  KvEventsConfig c;
  if (std::string err = parse_into(j, c); !err.empty()) {
    out.error = err;
    return out;
  }
  out.config = std::move(c);
  return out;
}

std::string offset_endpoint(std::string_view endpoint, std::size_t rank) {
  if (endpoint.empty() || rank == 0)
    return std::string(endpoint);
  if (endpoint.rfind("tcp://", 0) == 0) {
    const std::size_t colon = endpoint.rfind(':');
    const std::string_view port = endpoint.substr(colon + 1);
    unsigned long base = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), base);
    if (ec != std::errc() || end != port.data() + port.size())
      return std::string(endpoint);  // "*", or not a number: left to bind as given
    return std::string(endpoint.substr(0, colon + 1)) + std::to_string(base + rank);
  }
  return std::string(endpoint) + "_dp" + std::to_string(rank);
}

bool endpoint_binds(std::string_view endpoint) {
  return endpoint.find('*') != std::string_view::npos || endpoint.rfind("ipc://", 0) == 0 ||
         endpoint.rfind("inproc://", 0) == 0 || endpoint.find("::") != std::string_view::npos;
}

std::string hash_bytes(std::uint64_t hash) {
  std::string out;
  out.reserve(32);
  std::uint64_t word = hash;
  for (int i = 0; i < 4; ++i) {
    std::string be(8, '\0');
    for (int b = 0; b < 8; ++b)
      be[b] = static_cast<char>((word >> (8 * (7 - b))) & 0xff);
    out += be;
    word = fnv1a64(be);
  }
  return out;
}

std::string encode_batch(double ts, const std::vector<KvEvent>& events, int data_parallel_rank,
                         EventLayout layout, HashKind hashes) {
  MsgpackWriter w;
  // The batch is positional but in the map layout.
  const bool batch_map = layout == EventLayout::map;
  batch_map ? w.map(3) : w.array(3);
  if (batch_map)
    w.str("ts");
  w.float64(ts);
  if (batch_map)
    w.str("events");
  w.array(static_cast<std::uint32_t>(events.size()));
  for (const KvEvent& e : events)
    write_event(w, e, layout, hashes);
  if (batch_map)
    w.str("data_parallel_rank");
  w.integer(data_parallel_rank);
  return w.take();
}

}  // namespace pdgate::sim
