#include "plugins/msgpack_reader.hpp"

#include <bit>
#include <cstring>
#include <string>

namespace pdgate {

const char* to_string(MsgType t) {
  switch (t) {
    case MsgType::nil:
      return "nil";
    case MsgType::boolean:
      return "bool";
    case MsgType::integer:
      return "int";
    case MsgType::floating:
      return "float";
    case MsgType::str:
      return "str";
    case MsgType::bin:
      return "bin";
    case MsgType::array:
      return "array";
    case MsgType::map:
      return "map";
    case MsgType::ext:
      return "ext";
  }
  return "?";
}

namespace {

std::uint64_t big_endian(const std::uint8_t* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i)
    v = (v << 8) | p[i];
  return v;
}

Failure truncated() {
  return fail("msgpack: truncated value");
}

}  // namespace

Result<MsgpackReader::Header> MsgpackReader::header() const {
  if (at_end())
    return truncated();
  const std::uint8_t* p = bytes_.data() + pos_;
  const std::size_t left = remaining();
  const std::uint8_t b = p[0];
  Header h{MsgType::nil, 1, 0, 0, false};
  // A header whose fixed-size part (`n` bytes after the marker) is whole.
  const auto sized = [&](MsgType t, std::size_t n) -> Result<Header> {
    if (left < 1 + n)
      return truncated();
    h.type = t;
    h.header_len = 1 + n;
    h.length = big_endian(p + 1, n);
    return h;
  };
  Result<Header> r = h;
  if (b <= 0x7f) {
    h.type = MsgType::integer;
    h.value = b;
    r = h;
  } else if (b <= 0x8f) {
    h.type = MsgType::map;
    h.length = b & 0x0f;
    r = h;
  } else if (b <= 0x9f) {
    h.type = MsgType::array;
    h.length = b & 0x0f;
    r = h;
  } else if (b <= 0xbf) {
    h.type = MsgType::str;
    h.length = b & 0x1f;
    r = h;
  } else if (b >= 0xe0) {
    h.type = MsgType::integer;
    h.value = static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int8_t>(b)));
    h.negative = true;
    r = h;
  } else {
    switch (b) {
      case 0xc0:
        h.type = MsgType::nil;
        r = h;
        break;
      case 0xc2:
      case 0xc3:
        h.type = MsgType::boolean;
        h.value = b == 0xc3;
        r = h;
        break;
      case 0xc4:
        r = sized(MsgType::bin, 1);
        break;
      case 0xc5:
        r = sized(MsgType::bin, 2);
        break;
      case 0xc6:
        r = sized(MsgType::bin, 4);
        break;
      // ext: length, then a type byte, then the data.
      case 0xc7:
      case 0xc8:
      case 0xc9: {
        const std::size_t n = b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4;
        r = sized(MsgType::ext, n + 1);
        if (r)
          r->length = big_endian(p + 1, n);
        break;
      }
      case 0xca:
      case 0xcb: {
        r = sized(MsgType::floating, b == 0xca ? 4 : 8);
        if (r) {
          r->value = r->length;
          r->length = 0;
        }
        break;
      }
      case 0xcc:
      case 0xcd:
      case 0xce:
      case 0xcf: {
        r = sized(MsgType::integer, std::size_t{1} << (b - 0xcc));
        if (r) {
          r->value = r->length;
          r->length = 0;
        }
        break;
      }
      case 0xd0:
      case 0xd1:
      case 0xd2:
      case 0xd3: {
        const std::size_t n = std::size_t{1} << (b - 0xd0);
        r = sized(MsgType::integer, n);
        if (r) {
          // Sign-extend the n-byte value.
          const unsigned shift = static_cast<unsigned>(64 - 8 * n);
          r->value =
              static_cast<std::uint64_t>(static_cast<std::int64_t>(r->length << shift) >> shift);
          r->negative = true;
          r->length = 0;
        }
        break;
      }
      case 0xd4:
      case 0xd5:
      case 0xd6:
      case 0xd7:
      case 0xd8:
        r = sized(MsgType::ext, 1);
        if (r)
          r->length = std::size_t{1} << (b - 0xd4);
        break;
      case 0xd9:
        r = sized(MsgType::str, 1);
        break;
      case 0xda:
        r = sized(MsgType::str, 2);
        break;
      case 0xdb:
        r = sized(MsgType::str, 4);
        break;
      case 0xdc:
        r = sized(MsgType::array, 2);
        break;
      case 0xdd:
        r = sized(MsgType::array, 4);
        break;
      case 0xde:
        r = sized(MsgType::map, 2);
        break;
      case 0xdf:
        r = sized(MsgType::map, 4);
        break;
      default:
        return fail("msgpack: invalid marker byte 0xc1");
    }
  }
  if (!r)
    return r;
  // What follows the header must be there: payload bytes for str, bin and
  // ext; at least one byte per element (two per map entry) for containers.
  const std::uint64_t after = left - r->header_len;
  switch (r->type) {
    case MsgType::str:
    case MsgType::bin:
    case MsgType::ext:
      if (r->length > after)
        return truncated();
      break;
    case MsgType::array:
      if (r->length > after)
        return fail("msgpack: array of " + std::to_string(r->length) + " elements in fewer bytes");
      break;
    case MsgType::map:
      if (r->length > after / 2)
        return fail("msgpack: map of " + std::to_string(r->length) + " entries in fewer bytes");
      break;
    default:
      break;
  }
  return r;
}

Result<MsgType> MsgpackReader::peek() const {
  auto h = header();
  if (!h)
    return fail(h.error());
  return h->type;
}

namespace {
Failure wrong(MsgType want, MsgType got) {
  return fail(std::string("msgpack: expected ") + to_string(want) + ", got " + to_string(got));
}
}  // namespace

Result<std::size_t> MsgpackReader::read_array() {
  auto h = header();
  if (!h)
    return fail(h.error());
  if (h->type != MsgType::array)
    return wrong(MsgType::array, h->type);
  pos_ += h->header_len;
  return static_cast<std::size_t>(h->length);
}

Result<std::size_t> MsgpackReader::read_map() {
  auto h = header();
  if (!h)
    return fail(h.error());
  if (h->type != MsgType::map)
    return wrong(MsgType::map, h->type);
  pos_ += h->header_len;
  return static_cast<std::size_t>(h->length);
}

Result<std::int64_t> MsgpackReader::read_int() {
  auto h = header();
  if (!h)
    return fail(h.error());
  if (h->type != MsgType::integer)
    return wrong(MsgType::integer, h->type);
  pos_ += h->header_len;
  return static_cast<std::int64_t>(h->value);
}

Result<double> MsgpackReader::read_float() {
  auto h = header();
  if (!h)
    return fail(h.error());
  if (h->type == MsgType::integer) {
    pos_ += h->header_len;
    return h->negative ? static_cast<double>(static_cast<std::int64_t>(h->value))
                       : static_cast<double>(h->value);
  }
  if (h->type != MsgType::floating)
    return wrong(MsgType::floating, h->type);
  pos_ += h->header_len;
  if (h->header_len == 5)
    return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(h->value)));
  return std::bit_cast<double>(h->value);
}

Result<bool> MsgpackReader::read_bool() {
  auto h = header();
  if (!h)
    return fail(h.error());
  if (h->type != MsgType::boolean)
    return wrong(MsgType::boolean, h->type);
  pos_ += h->header_len;
  return h->value != 0;
}

Result<std::string_view> MsgpackReader::read_str() {
  auto h = header();
  if (!h)
    return fail(h.error());
  if (h->type != MsgType::str)
    return wrong(MsgType::str, h->type);
  const char* at = reinterpret_cast<const char*>(bytes_.data() + pos_ + h->header_len);
  pos_ += h->header_len + h->length;
  return std::string_view(at, h->length);
}

Result<std::span<const std::uint8_t>> MsgpackReader::read_bytes() {
  auto h = header();
  if (!h)
    return fail(h.error());
  if (h->type != MsgType::bin && h->type != MsgType::str)
    return wrong(MsgType::bin, h->type);
  const std::uint8_t* at = bytes_.data() + pos_ + h->header_len;
  pos_ += h->header_len + h->length;
  return std::span<const std::uint8_t>(at, h->length);
}

bool MsgpackReader::read_nil() {
  if (!at_end() && bytes_[pos_] == 0xc0) {
    ++pos_;
    return true;
  }
  return false;
}

Result<bool> MsgpackReader::skip() {
  // Values still to skip; containers add their elements. Every value
  // consumes at least a byte, so this ends within remaining() steps.
  std::uint64_t pending = 1;
  while (pending > 0) {
    auto h = header();
    if (!h)
      return fail(h.error());
    --pending;
    pos_ += h->header_len;
    switch (h->type) {
      case MsgType::str:
      case MsgType::bin:
      case MsgType::ext:
        pos_ += h->length;
        break;
      case MsgType::array:
        pending += h->length;
        break;
      case MsgType::map:
        pending += 2 * h->length;
        break;
      default:
        break;
    }
  }
  return true;
}

}  // namespace pdgate
