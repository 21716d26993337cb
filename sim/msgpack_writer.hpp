// A MessagePack encoder for the few types vLLM's KV events use (nil, bool,
// integers, float64, str, bin, array, map). Always the shortest encoding of
// an integer or a length, as msgpack-python and msgspec write them. The
// caller announces a container's size, then writes that many items (a map
// takes key, value, key, value, ...).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace pdgate::sim {

class MsgpackWriter {
 public:
  MsgpackWriter& nil();
  MsgpackWriter& boolean(bool v);
  MsgpackWriter& integer(std::int64_t v);  // non-negative values take the unsigned forms
  MsgpackWriter& uinteger(std::uint64_t v);
  MsgpackWriter& float64(double v);
  MsgpackWriter& str(std::string_view v);
  MsgpackWriter& bin(std::string_view v);
  MsgpackWriter& array(std::uint32_t size);
  MsgpackWriter& map(std::uint32_t size);

  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void byte(std::uint8_t b) { out_.push_back(static_cast<char>(b)); }
  void big_endian(std::uint64_t v, int width);
  // A type byte for lengths < 2^8 / 2^16 / 2^32 (fixed forms are handled
  // by the caller).
  void length(std::uint32_t n, std::uint8_t t8, std::uint8_t t16, std::uint8_t t32);

  std::string out_;
};

}  // namespace pdgate::sim
