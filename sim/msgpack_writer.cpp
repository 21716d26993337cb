#include "sim/msgpack_writer.hpp"

#include <bit>

namespace pdgate::sim {

void MsgpackWriter::big_endian(std::uint64_t v, int width) {
  for (int i = width - 1; i >= 0; --i)
    byte(static_cast<std::uint8_t>((v >> (8 * i)) & 0xff));
}

void MsgpackWriter::length(std::uint32_t n, std::uint8_t t8, std::uint8_t t16, std::uint8_t t32) {
  if (n <= 0xff && t8 != 0) {
    byte(t8);
    big_endian(n, 1);
  } else if (n <= 0xffff) {
    byte(t16);
    big_endian(n, 2);
  } else {
    byte(t32);
    big_endian(n, 4);
  }
}

MsgpackWriter& MsgpackWriter::nil() {
  byte(0xc0);
  return *this;
}

MsgpackWriter& MsgpackWriter::boolean(bool v) {
  byte(v ? 0xc3 : 0xc2);
  return *this;
}

MsgpackWriter& MsgpackWriter::uinteger(std::uint64_t v) {
  if (v <= 0x7f) {
    byte(static_cast<std::uint8_t>(v));
  } else if (v <= 0xff) {
    byte(0xcc);
    big_endian(v, 1);
  } else if (v <= 0xffff) {
    byte(0xcd);
    big_endian(v, 2);
  } else if (v <= 0xffffffffull) {
    byte(0xce);
    big_endian(v, 4);
  } else {
    byte(0xcf);
    big_endian(v, 8);
  }
  return *this;
}

MsgpackWriter& MsgpackWriter::integer(std::int64_t v) {
  if (v >= 0)
    return uinteger(static_cast<std::uint64_t>(v));
  const auto u = static_cast<std::uint64_t>(v);
  if (v >= -32) {
    byte(static_cast<std::uint8_t>(u & 0xff));  // negative fixint 0xe0..0xff
  } else if (v >= INT8_MIN) {
    byte(0xd0);
    big_endian(u, 1);
  } else if (v >= INT16_MIN) {
    byte(0xd1);
    big_endian(u, 2);
  } else if (v >= INT32_MIN) {
    byte(0xd2);
    big_endian(u, 4);
  } else {
    byte(0xd3);
    big_endian(u, 8);
  }
  return *this;
}

MsgpackWriter& MsgpackWriter::float64(double v) {
  byte(0xcb);
  big_endian(std::bit_cast<std::uint64_t>(v), 8);
  return *this;
}

MsgpackWriter& MsgpackWriter::str(std::string_view v) {
  const auto n = static_cast<std::uint32_t>(v.size());
  if (n <= 31) {
    byte(static_cast<std::uint8_t>(0xa0 | n));
  } else {
    length(n, 0xd9, 0xda, 0xdb);
  }
  out_.append(v);
  return *this;
}

MsgpackWriter& MsgpackWriter::bin(std::string_view v) {
  length(static_cast<std::uint32_t>(v.size()), 0xc4, 0xc5, 0xc6);
  out_.append(v);
  return *this;
}

MsgpackWriter& MsgpackWriter::array(std::uint32_t size) {
  if (size <= 15) {
    byte(static_cast<std::uint8_t>(0x90 | size));
  } else {
    length(size, 0, 0xdc, 0xdd);
  }
  return *this;
}

MsgpackWriter& MsgpackWriter::map(std::uint32_t size) {
  if (size <= 15) {
    byte(static_cast<std::uint8_t>(0x80 | size));
  } else {
    length(size, 0, 0xde, 0xdf);
  }
  return *this;
}

}  // namespace pdgate::sim
