// HTTP's character classes (core/base/http_tokens.hpp): the block scan for
// field-value characters stops exactly where a byte-by-byte scan stops,
// wherever the stopping byte is and whatever it is, and never reads past
// the end it is given (the buffers here are exactly as long as the text,
// so the sanitizer build would see a read past them).
#include "core/base/http_tokens.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace pdgate::http_tokens {
namespace {

const char* byte_by_byte(const char* p, const char* end) {
  while (p != end && is_value_char(*p))
    ++p;
  return p;
}

TEST(HttpTokens, ValueScanStopsWhereTheByteLoopStops) {
  for (std::size_t len = 0; len <= 40; ++len) {
    const std::unique_ptr<char[]> buf(new char[len]);
    for (std::size_t at = 0; at < len; ++at) {
      for (int b = 0; b < 256; ++b) {
        for (std::size_t i = 0; i < len; ++i)
          buf[i] = static_cast<char>('a' + i % 26);
        buf[at] = static_cast<char>(b);
        const char* end = buf.get() + len;
        ASSERT_EQ(skip_value_chars(buf.get(), end), byte_by_byte(buf.get(), end))
            << "length " << len << ", byte " << b << " at " << at;
      }
    }
    // No stopping byte: the scan runs to the end.
    for (std::size_t i = 0; i < len; ++i)
      buf[i] = static_cast<char>(i % 2 ? '\t' : '\x80');
    EXPECT_EQ(skip_value_chars(buf.get(), buf.get() + len), buf.get() + len);
  }
}

TEST(HttpTokens, ValueScanKeepsTabsAndObsText) {
  const std::string_view line = "text/plain;\tq=1 \xff\xfe tail\r\nNext: x";
  const char* stop = skip_value_chars(line.data(), line.data() + line.size());
  EXPECT_EQ(std::string_view(line.data(), static_cast<std::size_t>(stop - line.data())),
            "text/plain;\tq=1 \xff\xfe tail");
  const std::string_view del = "abcdefghijklmnopqrstuvw\x7fxyz";
  EXPECT_EQ(skip_value_chars(del.data(), del.data() + del.size()) - del.data(), 23);
}

// The ASCII-only scan (plain client headers) stops at obs-text, in the
// SIMD part and in the tail alike.
TEST(HttpTokens, AsciiValueScanStopsAtObsText) {
  const std::string_view line = "text/plain;\tq=1 and more \xff tail\r\n";
  const char* stop = skip_value_chars<false>(line.data(), line.data() + line.size());
  EXPECT_EQ(std::string_view(line.data(), static_cast<std::size_t>(stop - line.data())),
            "text/plain;\tq=1 and more ");
  const std::string_view tail = "ab\xc3";
  EXPECT_EQ(skip_value_chars<false>(tail.data(), tail.data() + tail.size()) - tail.data(), 2);
}

TEST(HttpTokens, TokenListsAndDecimalLengths) {
  std::vector<std::string> items;
  EXPECT_TRUE(for_each_token(" keep-alive, ,Upgrade\t",
                             [&](std::string_view t) { items.emplace_back(t); }));
  EXPECT_EQ(items, (std::vector<std::string>{"keep-alive", "Upgrade"}));
  EXPECT_FALSE(for_each_token("a b", [](std::string_view) {}));
  EXPECT_FALSE(for_each_token("a;b", [](std::string_view) {}));

  EXPECT_EQ(decimal_length("0"), 0u);
  EXPECT_EQ(decimal_length("9999999999999999999"), 9999999999999999999ull);  // 19 digits
  for (const std::string_view bad : {"", "12345678901234567890", "5, 5", "+5", "-1", " 5", "0x1"})
    EXPECT_FALSE(decimal_length(bad)) << bad;
}

}  // namespace
}  // namespace pdgate::http_tokens
