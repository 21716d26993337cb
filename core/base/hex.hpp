// Bytes as lowercase hex: request ids, trace and span ids, digests and
// JSON's \u00XX escapes. A request makes several ids, so whole blocks are
// converted at once where SSE2 is there.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pdgate {

// Lowercase hex digits by value.
inline constexpr char kHexDigits[] = "0123456789abcdef";

#if defined(__SSE2__)
namespace hex_detail {

// Sixteen nibbles (one per byte, 0-15) as their hex digits.
inline __m128i digits(__m128i nibbles) {
  const __m128i over_nine = _mm_cmpgt_epi8(nibbles, _mm_set1_epi8(9));
  const __m128i ascii = _mm_add_epi8(nibbles, _mm_set1_epi8('0'));
  return _mm_add_epi8(ascii, _mm_and_si128(over_nine, _mm_set1_epi8('a' - '0' - 10)));
}

// The high and low nibbles of each byte of `v`, interleaved high first
// (the order the digits are written in), as two vectors of digits.
inline void split(__m128i v, __m128i& first, __m128i& second) {
  const __m128i low_nibble = _mm_set1_epi8(0x0f);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), low_nibble);
  const __m128i lo = _mm_and_si128(v, low_nibble);
  first = digits(_mm_unpacklo_epi8(hi, lo));
  second = digits(_mm_unpackhi_epi8(hi, lo));
}

}  // namespace hex_detail
#endif

// Writes the 2*n hex digits of in[0..n) to out (no terminator).
inline void hex_encode(const std::uint8_t* in, std::size_t n, char* out) {
#if defined(__SSE2__)
  for (; n >= 16; n -= 16, in += 16, out += 32) {
    __m128i a, b;
    hex_detail::split(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)), a, b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), b);
  }
  if (n >= 8) {
    __m128i a, b;
    hex_detail::split(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in)), a, b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), a);
    n -= 8;
    in += 8;
    out += 16;
  }
#endif
  for (; n > 0; --n, ++in) {
    *out++ = kHexDigits[*in >> 4];
    *out++ = kHexDigits[*in & 0x0f];
  }
}

}  // namespace pdgate
