#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "sim/msgpack_writer.hpp"
#include "tests/sim/hex.hpp"

namespace pdgate::sim {
namespace {

// Every expected byte string below is what Debian's python3-msgpack 1.0.3
// writes for the same value (msgpack.packb(v, use_bin_type=True)), so a
// consumer using it decodes exactly what the sim sends.
using test::hex;

template <typename F>
std::string enc(F f) {
  MsgpackWriter w;
  f(w);
  return hex(w.bytes());
}

// nil and booleans are single bytes.
TEST(SimMsgpack, NilAndBooleans) {
  EXPECT_EQ(enc([](auto& w) { w.nil(); }), "c0");
  EXPECT_EQ(enc([](auto& w) { w.boolean(true); }), "c3");
  EXPECT_EQ(enc([](auto& w) { w.boolean(false); }), "c2");
}

// Unsigned integers take the shortest form at every width boundary.
TEST(SimMsgpack, UnsignedIntegersAtEveryBoundary) {
  EXPECT_EQ(enc([](auto& w) { w.uinteger(0); }), "00");
  EXPECT_EQ(enc([](auto& w) { w.uinteger(127); }), "7f");
  EXPECT_EQ(enc([](auto& w) { w.uinteger(128); }), "cc80");
  EXPECT_EQ(enc([](auto& w) { w.uinteger(255); }), "ccff");
  EXPECT_EQ(enc([](auto& w) { w.uinteger(256); }), "cd0100");
  EXPECT_EQ(enc([](auto& w) { w.uinteger(65535); }), "cdffff");
  EXPECT_EQ(enc([](auto& w) { w.uinteger(65536); }), "ce00010000");
  EXPECT_EQ(enc([](auto& w) { w.uinteger(4294967295u); }), "ceffffffff");
  EXPECT_EQ(enc([](auto& w) { w.uinteger(4294967296ull); }), "cf0000000100000000");
  EXPECT_EQ(enc([](auto& w) { w.uinteger(std::numeric_limits<std::uint64_t>::max()); }),
            "cfffffffffffffffff");
}

// Signed integers: non-negative ones as unsigned, negative ones shortest.
TEST(SimMsgpack, SignedIntegersAtEveryBoundary) {
  EXPECT_EQ(enc([](auto& w) { w.integer(5); }), "05");
  EXPECT_EQ(enc([](auto& w) { w.integer(300); }), "cd012c");
  EXPECT_EQ(enc([](auto& w) { w.integer(-1); }), "ff");
  EXPECT_EQ(enc([](auto& w) { w.integer(-32); }), "e0");
  EXPECT_EQ(enc([](auto& w) { w.integer(-33); }), "d0df");
  EXPECT_EQ(enc([](auto& w) { w.integer(-128); }), "d080");
  EXPECT_EQ(enc([](auto& w) { w.integer(-129); }), "d1ff7f");
  EXPECT_EQ(enc([](auto& w) { w.integer(-32768); }), "d18000");
  EXPECT_EQ(enc([](auto& w) { w.integer(-32769); }), "d2ffff7fff");
  EXPECT_EQ(enc([](auto& w) { w.integer(-2147483648ll); }), "d280000000");
  EXPECT_EQ(enc([](auto& w) { w.integer(-2147483649ll); }), "d3ffffffff7fffffff");
  EXPECT_EQ(enc([](auto& w) { w.integer(std::numeric_limits<std::int64_t>::min()); }),
            "d38000000000000000");
}

// Floats are always float64, big-endian IEEE 754.
TEST(SimMsgpack, Float64) {
  EXPECT_EQ(enc([](auto& w) { w.float64(1.5); }), "cb3ff8000000000000");
}

// str and bin switch forms at 31/32 and 255/256 bytes and carry the bytes after the length.
TEST(SimMsgpack, StringsAndBinaries) {
  EXPECT_EQ(enc([](auto& w) { w.str(""); }), "a0");
  EXPECT_EQ(enc([](auto& w) { w.str(std::string(31, 'a')); }).substr(0, 4), "bf61");
  EXPECT_EQ(enc([](auto& w) { w.str(std::string(32, 'a')); }).substr(0, 6), "d92061");
  EXPECT_EQ(enc([](auto& w) { w.str(std::string(256, 'b')); }).substr(0, 8), "da010062");
  EXPECT_EQ(enc([](auto& w) { w.str(std::string(256, 'b')); }).size(), 2u * 259);
  EXPECT_EQ(enc([](auto& w) { w.bin(""); }), "c400");
  EXPECT_EQ(enc([](auto& w) { w.bin("\x01\x02"); }), "c4020102");
  EXPECT_EQ(enc([](auto& w) { w.bin(std::string(256, 'x')); }).substr(0, 8), "c5010078");
  EXPECT_EQ(enc([](auto& w) { w.str(std::string(70000, 'c')); }).substr(0, 10), "db00011170");
}

// Containers: fix forms up to 15 items, then 16- and 32-bit counts; nesting follows the calls.
TEST(SimMsgpack, ArraysAndMaps) {
  // [1, [2, None], {"a": True}]
  EXPECT_EQ(enc([](auto& w) {
              w.array(3).integer(1).array(2).integer(2).nil().map(1).str("a").boolean(true);
            }),
            "93019202c081a161c3");
  EXPECT_EQ(enc([](auto& w) { w.array(16); }), "dc0010");
  EXPECT_EQ(enc([](auto& w) { w.map(16); }), "de0010");
  EXPECT_EQ(enc([](auto& w) { w.array(65536); }), "dd00010000");
  EXPECT_EQ(enc([](auto& w) { w.map(65536); }), "df00010000");
}

}  // namespace
}  // namespace pdgate::sim
