// A bounded, pull-style reader of MessagePack (the encoding of vLLM's KV
// events, plugins/kv_event_decoder.hpp). It reads values in place from a
// byte span and never allocates: a length read from the input is checked
// against the bytes that remain before anyone sizes anything by it, so a
// hostile publisher cannot make the gateway reserve memory it did not send.
// libmsgpack-cxx cannot be used (it pulls another Boost).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/base/result.hpp"

namespace pdgate {

enum class MsgType { nil, boolean, integer, floating, str, bin, array, map, ext };
const char* to_string(MsgType t);

class MsgpackReader {
 public:
  explicit MsgpackReader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}

  bool at_end() const { return pos_ >= bytes_.size(); }
  std::size_t remaining() const { return bytes_.size() - pos_; }
  std::size_t position() const { return pos_; }

  // The type of the next value, without consuming it.
  Result<MsgType> peek() const;

  // Each reads one value of its type or fails without consuming it.
  // Containers yield their element count (their elements follow); the
  // count is at most the bytes remaining (each element takes one byte at
  // least), so a caller may size a buffer by it.
  Result<std::size_t> read_array();
  Result<std::size_t> read_map();
  // Any integer: signed values as they are, unsigned ones above INT64_MAX
  // as their two's-complement int64 (hashes use every bit).
  Result<std::int64_t> read_int();
  Result<double> read_float();  // float 32/64, or an integer
  Result<bool> read_bool();
  Result<std::string_view> read_str();
  // bin or str: raw bytes.
  Result<std::span<const std::uint8_t>> read_bytes();
  // Consumes a nil and returns true; leaves anything else and returns false.
  bool read_nil();
  // Skips one whole value, containers included (iteratively: nesting
  // depth costs no stack).
  Result<bool> skip();

 private:
  struct Header {
    MsgType type;
    std::size_t header_len;  // bytes of the header itself
    std::uint64_t length;    // payload bytes (str/bin/ext) or element count
    std::uint64_t value;     // integer payload / bool, float bits
    bool negative;           // signed integer
  };
  Result<Header> header() const;

  std::span<const std::uint8_t> bytes_;
  std::size_t pos_ = 0;
};

}  // namespace pdgate
