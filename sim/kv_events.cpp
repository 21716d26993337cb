#include "sim/kv_events.hpp"

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

// One field: its name first in the map layout, nothing extra in the array one.
void field(MsgpackWriter& w, EventLayout layout, std::string_view name) {
  if (layout == EventLayout::map)
    w.str(name);
}

void open_struct(MsgpackWriter& w, EventLayout layout, std::uint32_t fields) {
  layout == EventLayout::map ? w.map(fields) : w.array(fields);
}

// An event's container and its type tag: positional element 0, or the
// "type" key. `fields` counts the tag.
void open_event(MsgpackWriter& w, EventLayout layout, std::uint32_t fields, std::string_view type) {
  open_struct(w, layout, fields);
  field(w, layout, "type");
  w.str(type);
}

void write_event(MsgpackWriter& w, const KvEvent& e, EventLayout layout, HashKind kind) {
  if (const auto* s = std::get_if<BlockStored>(&e)) {
    open_event(w, layout, 8, "BlockStored");
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
    w.nil();
    field(w, layout, "medium");
    w.str("GPU");
    field(w, layout, "lora_name");
    w.nil();
  } else if (const auto* r = std::get_if<BlockRemoved>(&e)) {
    open_event(w, layout, 3, "BlockRemoved");
    field(w, layout, "block_hashes");
    write_hashes(w, r->block_hashes, kind);
    field(w, layout, "medium");
    w.str("GPU");
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
  open_struct(w, layout, 3);
  field(w, layout, "ts");
  w.float64(ts);
  field(w, layout, "events");
  w.array(static_cast<std::uint32_t>(events.size()));
  for (const KvEvent& e : events)
    write_event(w, e, layout, hashes);
  field(w, layout, "data_parallel_rank");
  w.integer(data_parallel_rank);
  return w.take();
}

}  // namespace pdgate::sim
