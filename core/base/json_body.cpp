#include "core/base/json_body.hpp"

#include "core/base/hex.hpp"

#include <array>
#include <bitset>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pdgate {
namespace {

// Byte classes inside a string literal. A lookup table keeps the hot loop
// (long prompts and base64 images) to one load and one compare per byte.
enum : std::uint8_t { kPlain = 0, kQuote, kEscape, kControl, kHigh };

constexpr std::array<std::uint8_t, 256> make_string_classes() {
  std::array<std::uint8_t, 256> t{};
  for (int c = 0; c < 256; ++c) {
    if (c < 0x20) {
      t[c] = kControl;
    } else if (c == '"') {
      t[c] = kQuote;
    } else if (c == '\\') {
      t[c] = kEscape;
    } else if (c >= 0x80) {
      t[c] = kHigh;
    } else {
      t[c] = kPlain;
    }
  }
  return t;
}
constexpr std::array<std::uint8_t, 256> kStringClass = make_string_classes();

// True when none of the 8 bytes at `p` needs attention inside a string
// (quote, backslash, control character or non-ASCII). Testing a word at a
// time speeds up long plain strings such as base64 images; a word with any
// such byte falls back to the byte table.
bool eight_plain_bytes(const char* p) {
  constexpr std::uint64_t kOnes = 0x0101010101010101ull;
  constexpr std::uint64_t kHighs = 0x8080808080808080ull;
  std::uint64_t x;
  std::memcpy(&x, p, sizeof x);
  const auto has_zero_byte = [&](std::uint64_t v) { return (v - kOnes) & ~v & kHighs; };
  const std::uint64_t special = has_zero_byte(x ^ (kOnes * '"')) |
                                has_zero_byte(x ^ (kOnes * '\\')) |
                                ((x - kOnes * 0x20) & ~x & kHighs) | (x & kHighs);
  return special == 0;
}

#if defined(__SSE2__)
// How many of the 16 bytes at `p` come before the first one that needs
// attention inside a string (16 when none does): one compare per class
// for 16 bytes. A signed compare below 0x20 catches both the control
// characters and every byte >= 0x80.
std::size_t plain_prefix16(const char* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i special = _mm_or_si128(
      _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
      _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
  const auto mask = static_cast<unsigned>(_mm_movemask_epi8(special));
  return mask == 0 ? 16 : static_cast<std::size_t>(__builtin_ctz(mask));
}
#endif

// Index of the first byte at or after `run` in `t` that is not plain
// inside a string (t.size() when there is none).
std::size_t skip_plain(std::string_view t, std::size_t run) {
  const std::size_t n = t.size();
#if defined(__SSE2__)
  while (run + 16 <= n) {
    const std::size_t k = plain_prefix16(t.data() + run);
    run += k;
    if (k < 16)
      return run;
  }
#endif
  while (run + 8 <= n && eight_plain_bytes(t.data() + run))
    run += 8;
  while (run < n && kStringClass[static_cast<unsigned char>(t[run])] == kPlain)
    ++run;
  return run;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

// Length of the valid UTF-8 sequence starting at text[pos] (a byte >=
// 0x80), or 0 if it is invalid: overlong forms, UTF-16 surrogates and code
// points above U+10FFFF are rejected, as RFC 3629 requires.
std::size_t utf8_sequence_length(std::string_view text, std::size_t pos) {
  const auto byte = [&](std::size_t i) -> unsigned {
    return i < text.size() ? static_cast<unsigned char>(text[i]) : 0u;
  };
  const unsigned b0 = byte(pos);
  const auto cont = [&](std::size_t i) { return (byte(i) & 0xC0u) == 0x80u; };
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    return cont(pos + 1) ? 2 : 0;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    const unsigned b1 = byte(pos + 1);
    if (b0 == 0xE0 && b1 < 0xA0)
      return 0;  // overlong
    if (b0 == 0xED && b1 >= 0xA0)
      return 0;  // surrogate half
    return cont(pos + 1) && cont(pos + 2) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    const unsigned b1 = byte(pos + 1);
    if (b0 == 0xF0 && b1 < 0x90)
      return 0;  // overlong
    if (b0 == 0xF4 && b1 >= 0x90)
      return 0;  // above U+10FFFF
    return cont(pos + 1) && cont(pos + 2) && cont(pos + 3) ? 4 : 0;
  }
  return 0;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The open containers of a scan, innermost last: a bit each (set for an
// object), at most kMaxJsonDepth.
class ContainerStack {
 public:
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool back() const { return bits_[size_ - 1]; }
  void push_back(bool is_object) { bits_[size_++] = is_object; }
  void pop_back() { --size_; }

 private:
  std::bitset<kMaxJsonDepth> bits_;
  std::size_t size_ = 0;
};

// A strict single-pass JSON scanner. It keeps its own container stack
// instead of recursing, so a hostile body cannot exhaust the (possibly
// small) stack of the thread or coroutine that validates it.
class Scanner {
 public:
  explicit Scanner(std::string_view text, std::size_t pos = 0) : t_(text), p_(pos) {}

  std::size_t pos() const { return p_; }
  bool at_end() const { return p_ >= t_.size(); }
  char peek() const { return p_ < t_.size() ? t_[p_] : '\0'; }
  void advance() { ++p_; }

  void skip_ws() {
    while (p_ < t_.size() && is_json_ws(t_[p_]))
      ++p_;
  }

  // Records the first error; later ones would only describe its fallout.
  bool error(std::string what) { return error_at(p_, std::move(what)); }
  bool error_at(std::size_t at, std::string what) {
    if (err_.empty()) {
      err_ = "invalid JSON at byte " + std::to_string(at) + ": " + std::move(what);
    }
    return false;
  }
  Failure failure() const { return fail(err_); }

  // Scans a string literal starting at the opening quote. When `decoded` is
  // not null, the unescaped value is appended to it.
  bool string(std::string* decoded) {
    if (peek() != '"')
      return error("expected a string");
    ++p_;
    const std::size_t n = t_.size();
    while (true) {
      const std::size_t run = skip_plain(t_, p_);
      if (decoded != nullptr)
        decoded->append(t_.data() + p_, run - p_);
      p_ = run;
      if (p_ >= n)
        return error("unterminated string");
      switch (kStringClass[static_cast<unsigned char>(t_[p_])]) {
        case kQuote:
          ++p_;
          return true;
        case kControl:
          return error("unescaped control character in string");
        case kHigh: {
          const std::size_t len = utf8_sequence_length(t_, p_);
          if (len == 0)
            return error("invalid UTF-8 in string");
          if (decoded != nullptr)
            decoded->append(t_.data() + p_, len);
          p_ += len;
          break;
        }
        case kEscape:
          if (!escape(decoded))
            return false;
          break;
        default:
          break;
      }
    }
  }

  bool number() {
    const std::size_t start = p_;
    if (peek() == '-')
      ++p_;
    if (peek() == '0') {
      ++p_;
      if (is_digit(peek()))
        return error_at(start, "leading zero in number");
    } else if (is_digit(peek())) {
      while (is_digit(peek()))
        ++p_;
    } else {
      return error("expected a digit");
    }
    if (peek() == '.') {
      ++p_;
      if (!is_digit(peek()))
        return error("expected a digit after the decimal point");
      while (is_digit(peek()))
        ++p_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++p_;
      if (peek() == '+' || peek() == '-')
        ++p_;
      if (!is_digit(peek()))
        return error("expected a digit in the exponent");
      while (is_digit(peek()))
        ++p_;
    }
    return true;
  }

  bool literal(std::string_view word) {
    if (t_.substr(p_, word.size()) != word)
      return error("invalid literal");
    p_ += word.size();
    return true;
  }

  // Scans one complete value of any type. `depth` is the nesting level of
  // the container holding it (0 at the top level).
  bool value(std::size_t depth) {
    // One entry per open container: true for objects, false for arrays.
    // A fixed set of bits (64 bytes), as deep as any body may nest: no
    // allocation for the few containers a request body opens.
    ContainerStack stack;
    while (true) {
      // Expecting a value here.
      skip_ws();
      const char c = peek();
      bool opened = false;
      if (c == '{' || c == '[') {
        if (depth + stack.size() + 1 > kMaxJsonDepth) {
          return error("nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels");
        }
        const bool is_object = c == '{';
        stack.push_back(is_object);
        ++p_;
        skip_ws();
        if (is_object && peek() == '}') {
          ++p_;
          stack.pop_back();
        } else if (!is_object && peek() == ']') {
          ++p_;
          stack.pop_back();
        } else {
          opened = true;
          if (is_object && !member_key())
            return false;
        }
      } else if (c == '"') {
        if (!string(nullptr))
          return false;
      } else if (c == '-' || is_digit(c)) {
        if (!number())
          return false;
      } else if (c == 't') {
        if (!literal("true"))
          return false;
      } else if (c == 'f') {
        if (!literal("false"))
          return false;
      } else if (c == 'n') {
        if (!literal("null"))
          return false;
      } else if (at_end()) {
        return error("unexpected end of input, expected a value");
      } else {
        return error("expected a value");
      }
      if (opened)
        continue;
      // A value is complete: close containers or move to the next element.
      while (true) {
        if (stack.empty())
          return true;
        skip_ws();
        const bool in_object = stack.back();
        const char d = peek();
        if (d == ',') {
          ++p_;
          if (in_object) {
            skip_ws();
            if (!member_key())
              return false;
          } else {
            skip_integer_run();
          }
          break;
        }
        if (d == (in_object ? '}' : ']')) {
          ++p_;
          stack.pop_back();
          continue;
        }
        if (at_end())
          return error("unexpected end of input inside a container");
        return error(in_object ? "expected ',' or '}'" : "expected ',' or ']'");
      }
    }
  }

  // Inside an array, right after a ',': consumes the elements that are
  // plain non-negative integers each followed directly by ',' (a prefill
  // answer's block ids: 16,384 of them for a 1 MiB prompt), 3x faster
  // than the general loop. It stops before anything else, the last
  // element included, which the general loop then scans (and judges:
  // "01", "1.5", " 2" all end the run).
  void skip_integer_run() {
    const char* s = t_.data();
    const std::size_t n = t_.size();
    std::size_t q = p_;
    while (q < n) {
      std::size_t r = q;
      if (s[r] == '0') {
        ++r;
      } else if (s[r] >= '1' && s[r] <= '9') {
        ++r;
        while (r < n && is_digit(s[r]))
          ++r;
      } else {
        break;
      }
      if (r >= n || s[r] != ',')
        break;
      q = r + 1;
    }
    p_ = q;
  }

  // `"key" :` inside an object, ending before the value.
  bool member_key(std::string* decoded = nullptr) {
    if (peek() != '"') {
      if (peek() == '}')
        return error("trailing comma before '}'");
      return error("expected a string key");
    }
    if (!string(decoded))
      return false;
    skip_ws();
    if (peek() != ':')
      return error("expected ':' after key");
    ++p_;
    return true;
  }

 private:
  bool escape(std::string* decoded) {
    const std::size_t start = p_;
    ++p_;  // the backslash
    if (at_end())
      return error("unterminated escape");
    const char e = t_[p_++];
    char simple = 0;
    switch (e) {
      case '"':
        simple = '"';
        break;
      case '\\':
        simple = '\\';
        break;
      case '/':
        simple = '/';
        break;
      case 'b':
        simple = '\b';
        break;
      case 'f':
        simple = '\f';
        break;
      case 'n':
        simple = '\n';
        break;
      case 'r':
        simple = '\r';
        break;
      case 't':
        simple = '\t';
        break;
      case 'u':
        break;
      default:
        return error_at(start, "invalid escape");
    }
    if (e != 'u') {
      if (decoded != nullptr)
        decoded->push_back(simple);
      return true;
    }
    std::uint32_t cp = 0;
    if (!hex4(cp))
      return false;
    if (cp >= 0xDC00 && cp <= 0xDFFF)
      return error_at(start, "lone low surrogate");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (t_.substr(p_, 2) != "\\u")
        return error_at(start, "lone high surrogate");
      const std::size_t low_start = p_;
      p_ += 2;
      std::uint32_t low = 0;
      if (!hex4(low))
        return false;
      if (low < 0xDC00 || low > 0xDFFF)
        return error_at(low_start, "high surrogate not followed by a low surrogate");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    if (decoded != nullptr)
      append_utf8(*decoded, cp);
    return true;
  }

  bool hex4(std::uint32_t& out) {
    if (p_ + 4 > t_.size())
      return error("truncated \\u escape");
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = hex_value(t_[p_ + i]);
      if (h < 0)
        return error_at(p_ + i, "invalid hex digit in \\u escape");
      v = (v << 4) | static_cast<std::uint32_t>(h);
    }
    p_ += 4;
    out = v;
    return true;
  }

  std::string_view t_;
  std::size_t p_ = 0;
  std::string err_;
};

}  // namespace

Result<JsonObjectIndex> index_json_object(std::string_view text) {
  Scanner s(text);
  JsonObjectIndex index;
  s.skip_ws();
  if (s.at_end()) {
    s.error(text.empty() ? "empty body, expected a JSON object" : "expected a JSON object");
    return s.failure();
  }
  if (s.peek() != '{') {
    s.error("the top level must be a JSON object");
    return s.failure();
  }
  index.open_brace = s.pos();
  // Completion requests have a dozen members or so: one allocation.
  index.members.reserve(16);
  s.advance();
  s.skip_ws();
  if (s.peek() == '}') {
    index.close_brace = s.pos();
    s.advance();
  } else {
    while (true) {
      JsonMember m;
      m.begin = s.pos();
      if (!s.member_key(&m.key))
        return s.failure();
      s.skip_ws();
      m.value_begin = s.pos();
      if (!s.value(1))
        return s.failure();
      m.value_end = m.end = s.pos();
      index.members.push_back(std::move(m));
      s.skip_ws();
      if (s.peek() == ',') {
        s.advance();
        s.skip_ws();
        continue;
      }
      if (s.peek() == '}') {
        index.close_brace = s.pos();
        s.advance();
        break;
      }
      if (s.at_end()) {
        s.error("unexpected end of input inside the object");
      } else {
        s.error("expected ',' or '}'");
      }
      return s.failure();
    }
  }
  s.skip_ws();
  if (!s.at_end()) {
    s.error("unexpected data after the JSON object");
    return s.failure();
  }
  return index;
}

Result<bool> validate_json(std::string_view text) {
  Scanner s(text);
  if (!s.value(0))
    return s.failure();
  s.skip_ws();
  if (!s.at_end()) {
    s.error("unexpected data after the JSON value");
    return s.failure();
  }
  return true;
}

bool JsonArrayElements::next(std::string_view& element) {
  if (state_ == State::done || state_ == State::failed)
    return false;
  Scanner s(text_, pos_);
  s.skip_ws();
  auto end_of_array = [&] {
    s.advance();  // the ']'
    s.skip_ws();
    state_ = s.at_end() ? State::done : State::failed;
    return false;
  };
  if (state_ == State::start) {
    if (s.peek() != '[') {
      state_ = State::failed;
      return false;
    }
    s.advance();
    s.skip_ws();
    if (s.peek() == ']')
      return end_of_array();
  } else if (s.peek() == ',') {
    s.advance();
    s.skip_ws();
  } else if (s.peek() == ']') {
    return end_of_array();
  } else {
    state_ = State::failed;
    return false;
  }
  const std::size_t begin = s.pos();
  if (!s.value(1)) {
    state_ = State::failed;
    return false;
  }
  element = text_.substr(begin, s.pos() - begin);
  pos_ = s.pos();
  state_ = State::element;
  return true;
}

std::optional<std::string_view> raw_at_path(std::string_view raw, const JsonPathStep* path,
                                            std::size_t steps, JsonScanTick tick, void* user) {
  if (steps > kMaxJsonPathSteps)
    return std::nullopt;
  for (std::size_t k = 0; k < steps; ++k) {
    const JsonPathStep& step = path[k];
    if (step.is_index) {
      JsonArrayElements it(raw);
      std::string_view e;
      std::size_t i = 0;
      for (;;) {
        if (!it.next(e))
          return std::nullopt;
        if (i == step.index)
          break;
        if (++i % 4096 == 0 && tick != nullptr)
          tick(user);
      }
      raw = e;
    } else {
      // An object's members are indexed in one pass over it (and only it).
      if (raw.empty() || raw.front() != '{')
        return std::nullopt;
      const auto index = index_json_object(raw);
      if (!index)
        return std::nullopt;
      const auto v = raw_member(raw, *index, step.key);
      if (!v)
        return std::nullopt;
      raw = *v;
    }
  }
  return raw;
}

std::optional<std::string_view> raw_member(std::string_view text, const JsonObjectIndex& index,
                                           std::string_view key) {
  for (auto it = index.members.rbegin(); it != index.members.rend(); ++it) {
    if (it->key == key)
      return text.substr(it->value_begin, it->value_end - it->value_begin);
  }
  return std::nullopt;
}

std::optional<bool> bool_member(std::string_view text, const JsonObjectIndex& index,
                                std::string_view key) {
  const auto raw = raw_member(text, index, key);
  if (!raw)
    return std::nullopt;
  if (*raw == "true")
    return true;
  if (*raw == "false")
    return false;
  return std::nullopt;
}

std::optional<std::string> string_member(std::string_view text, const JsonObjectIndex& index,
                                         std::string_view key) {
  const auto raw = raw_member(text, index, key);
  if (!raw || raw->empty() || raw->front() != '"')
    return std::nullopt;
  return decode_json_string(*raw);
}

std::optional<std::int64_t> integral_value(std::string_view raw) {
  std::string decoded;
  if (!raw.empty() && raw.front() == '"') {
    auto text = decode_json_string(raw);
    if (!text)
      return std::nullopt;
    decoded = std::move(*text);
    raw = decoded;
    // A string must hold an integer literal, as Python's int() reads one.
    const auto digits = raw.substr(!raw.empty() && (raw.front() == '-' || raw.front() == '+'));
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos)
      return std::nullopt;
    if (raw.front() == '+')
      raw.remove_prefix(1);
  }
  const char* const first = raw.data();
  const char* const last = raw.data() + raw.size();
  std::int64_t whole = 0;
  if (const auto [end, ec] = std::from_chars(first, last, whole); ec == std::errc{} && end == last)
    return whole;
  // A fraction or exponent: read as the double JSON parsers make of it, and
  // accepted when that double is a whole number that int64 holds
  // (-2^63 <= d < 2^63, both bounds exact in a double).
  double d = 0;
  if (const auto [end, ec] = std::from_chars(first, last, d); ec != std::errc{} || end != last)
    return std::nullopt;
  constexpr double kTwo63 = 9223372036854775808.0;
  if (!std::isfinite(d) || d != std::floor(d) || d < -kTwo63 || d >= kTwo63)
    return std::nullopt;
  return static_cast<std::int64_t>(d);
}

std::optional<std::string> decode_json_string(std::string_view literal) {
  Scanner s(literal);
  std::string out;
  if (!s.string(&out) || !s.at_end())
    return std::nullopt;
  return out;
}

bool append_json_string(std::string_view literal, std::string& out) {
  const std::size_t before = out.size();
  Scanner s(literal);
  if (s.string(&out) && s.at_end())
    return true;
  out.resize(before);
  return false;
}

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const std::size_t len = utf8_sequence_length(s, i);
      if (len == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(s.data() + i, len);
        i += len;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(kHexDigits[c >> 4]);
          out.push_back(kHexDigits[c & 0xF]);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  out.push_back('"');
  return out;
}

}  // namespace pdgate
