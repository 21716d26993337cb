// The bounded Lua pattern matcher: Lua 5.1's algorithm (a recursive
// backtracking matcher over pattern items), with every loop and recursion
// counting steps so that a deadline can stop it.
#include "policies/lua_patterns.hpp"

#include <cstring>

namespace pdgate::policy::pattern {
namespace {

constexpr char kEsc = '%';

// ASCII character classes, independent of the C locale (as LuaJIT's are).
bool is_alpha(unsigned c) {
  return (c | 0x20) - 'a' < 26;
}
bool is_digit(unsigned c) {
  return c - '0' < 10;
}
bool is_lower(unsigned c) {
  return c - 'a' < 26;
}
bool is_upper(unsigned c) {
  return c - 'A' < 26;
}
bool is_space(unsigned c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}
bool is_cntrl(unsigned c) {
  return c < 32 || c == 127;
}
bool is_punct(unsigned c) {
  return c > 32 && c < 127 && !is_alpha(c) && !is_digit(c);
}
bool is_xdigit(unsigned c) {
  return is_digit(c) || (c | 0x20) - 'a' < 6;
}

// Whether `c` is in the class named by the letter `cl` (%a, %d, ...; an
// upper-case letter is the complement); any other `cl` stands for itself.
bool match_class(unsigned c, unsigned cl) {
  bool res;
  switch (cl | 0x20) {
    case 'a':
      res = is_alpha(c);
      break;
    case 'c':
      res = is_cntrl(c);
      break;
    case 'd':
      res = is_digit(c);
      break;
    case 'l':
      res = is_lower(c);
      break;
    case 'p':
      res = is_punct(c);
      break;
    case 's':
      res = is_space(c);
      break;
    case 'u':
      res = is_upper(c);
      break;
    case 'w':
      res = is_alpha(c) || is_digit(c);
      break;
    case 'x':
      res = is_xdigit(c);
      break;
    case 'z':
      res = c == 0;
      break;
    default:
      return cl == c;
  }
  return is_upper(cl) ? !res : res;
}

}  // namespace

bool has_specials(const char* pattern) {
  return std::strpbrk(pattern, "^$*+?.([%-") != nullptr;
}

bool Matcher::charge(std::size_t n) {
  if (stopped_ || failed_)
    return false;
  steps_ += static_cast<std::uint32_t>(n > kCheckSteps ? kCheckSteps : n);
  if (steps_ < kCheckSteps)
    return true;
  steps_ = 0;
  if (keep_going_ != nullptr && !keep_going_(user_)) {
    stopped_ = true;
    failed_ = true;
    return false;
  }
  return true;
}

const char* Matcher::fail(const char* message) {
  if (!failed_) {
    failed_ = true;
    error_ = message;
  }
  return nullptr;
}

const char* Matcher::class_end(const char* p) {
  switch (*p++) {
    case kEsc:
      if (*p == '\0')
        return fail("malformed pattern (ends with '%')");
      return p + 1;
    case '[':
      if (*p == '^')
        ++p;
      // Up to the closing ']'; a ']' right after '[' or '[^' is a member.
      do {
        if (*p == '\0')
          return fail("malformed pattern (missing ']')");
        if (*(p++) == kEsc && *p != '\0')
          ++p;
      } while (*p != ']');
      return p + 1;
    default:
      return p;
  }
}

// `p` points at '[' and `ec` at the closing ']'.
bool Matcher::match_bracket_class(unsigned char c, const char* p, const char* ec) {
  bool sig = true;
  if (*(p + 1) == '^') {
    sig = false;
    ++p;
  }
  // A long set costs in proportion to its length for each character tried.
  charge(static_cast<std::size_t>(ec - p) / 16);
  while (++p < ec) {
    if (*p == kEsc) {
      ++p;
      if (match_class(c, static_cast<unsigned char>(*p)))
        return sig;
    } else if (*(p + 1) == '-' && p + 2 < ec) {
      p += 2;
      if (static_cast<unsigned char>(*(p - 2)) <= c && c <= static_cast<unsigned char>(*p))
        return sig;
    } else if (static_cast<unsigned char>(*p) == c) {
      return sig;
    }
  }
  return !sig;
}

bool Matcher::single_match(unsigned char c, const char* p, const char* ep) {
  switch (*p) {
    case '.':
      return true;
    case kEsc:
      return match_class(c, static_cast<unsigned char>(*(p + 1)));
    case '[':
      return match_bracket_class(c, p, ep - 1);
    default:
      return static_cast<unsigned char>(*p) == c;
  }
}

const char* Matcher::match_balance(const char* s, const char* p) {
  if (*p == '\0' || *(p + 1) == '\0')
    return fail("unbalanced pattern");
  if (s >= src_end_ || *s != *p)
    return nullptr;
  const char open = *p;
  const char close = *(p + 1);
  int depth = 1;
  while (++s < src_end_) {
    if (!tick())
      return nullptr;
    if (*s == close) {
      if (--depth == 0)
        return s + 1;
    } else if (*s == open) {
      ++depth;
    }
  }
  return nullptr;
}

const char* Matcher::max_expand(const char* s, const char* p, const char* ep) {
  std::ptrdiff_t i = 0;
  while (s + i < src_end_ && single_match(static_cast<unsigned char>(s[i]), p, ep)) {
    if (!tick())
      return nullptr;
    ++i;
  }
  // Longest first, backing off one character at a time.
  for (; i >= 0; --i) {
    const char* res = do_match(s + i, ep + 1);
    if (res != nullptr || failed_)
      return res;
  }
  return nullptr;
}

const char* Matcher::min_expand(const char* s, const char* p, const char* ep) {
  for (;;) {
    const char* res = do_match(s, ep + 1);
    if (res != nullptr || failed_)
      return res;
    if (s < src_end_ && single_match(static_cast<unsigned char>(*s), p, ep))
      ++s;
    else
      return nullptr;
  }
}

const char* Matcher::start_capture(const char* s, const char* p, std::ptrdiff_t what) {
  if (level_ >= kMaxCaptures)
    return fail("too many captures");
  capture_[level_].init = s;
  capture_[level_].len = what;
  ++level_;
  const char* res = do_match(s, p);
  if (res == nullptr)
    --level_;
  return res;
}

const char* Matcher::end_capture(const char* s, const char* p) {
  int l = -1;
  for (int i = level_ - 1; i >= 0; --i) {
    if (capture_[i].len == kCapUnfinished) {
      l = i;
      break;
    }
  }
  if (l < 0)
    return fail("invalid pattern capture");
  capture_[l].len = s - capture_[l].init;
  const char* res = do_match(s, p);
  if (res == nullptr)
    capture_[l].len = kCapUnfinished;
  return res;
}

const char* Matcher::match_capture(const char* s, int l) {
  l -= '1';
  if (l < 0 || l >= level_ || capture_[l].len == kCapUnfinished)
    return fail("invalid capture index");
  const std::ptrdiff_t len = capture_[l].len;
  // A position capture never matches as a back reference (as in Lua).
  if (len < 0 || src_end_ - s < len)
    return nullptr;
  if (!charge(static_cast<std::size_t>(len) / 16))
    return nullptr;
  return std::memcmp(capture_[l].init, s, static_cast<std::size_t>(len)) == 0 ? s + len : nullptr;
}

const char* Matcher::match(const char* s, const char* pattern) {
  if (failed_)
    return nullptr;
  return do_match(s, pattern);
}

const char* Matcher::do_match(const char* s, const char* p) {
  if (++depth_ > kMaxDepth)
    return fail("pattern too complex");
  struct Leave {
    int& d;
    ~Leave() { --d; }
  } leave{depth_};
  for (;;) {
    if (!tick())
      return nullptr;
    switch (*p) {
      case '(':
        if (*(p + 1) == ')')
          return start_capture(s, p + 2, kCapPosition);
        return start_capture(s, p + 1, kCapUnfinished);
      case ')':
        return end_capture(s, p + 1);
      case '\0':
        return s;
      case kEsc:
        if (*(p + 1) == 'b') {
          s = match_balance(s, p + 2);
          if (s == nullptr)
            return nullptr;
          p += 4;
          continue;
        }
        if (*(p + 1) == 'f') {
          p += 2;
          if (*p != '[')
            return fail("missing '[' after '%f' in pattern");
          const char* ep = class_end(p);
          if (ep == nullptr)
            return nullptr;
          const auto prev = static_cast<unsigned char>(s == src_init_ ? '\0' : *(s - 1));
          const auto cur = static_cast<unsigned char>(s < src_end_ ? *s : '\0');
          if (match_bracket_class(prev, p, ep - 1) || !match_bracket_class(cur, p, ep - 1))
            return nullptr;
          p = ep;
          continue;
        }
        if (is_digit(static_cast<unsigned char>(*(p + 1)))) {
          s = match_capture(s, static_cast<unsigned char>(*(p + 1)));
          if (s == nullptr)
            return nullptr;
          p += 2;
          continue;
        }
        break;
      case '$':
        if (*(p + 1) == '\0')
          return s == src_end_ ? s : nullptr;
        break;
      default:
        break;
    }
    // A single-character class, maybe followed by a quantifier.
    const char* ep = class_end(p);
    if (ep == nullptr)
      return nullptr;
    const bool m = s < src_end_ && single_match(static_cast<unsigned char>(*s), p, ep);
    switch (*ep) {
      case '?': {
        if (m) {
          const char* res = do_match(s + 1, ep + 1);
          if (res != nullptr || failed_)
            return res;
        }
        p = ep + 1;
        continue;
      }
      case '*':
        return max_expand(s, p, ep);
      case '+':
        return m ? max_expand(s + 1, p, ep) : nullptr;
      case '-':
        return min_expand(s, p, ep);
      default:
        if (!m)
          return nullptr;
        ++s;
        p = ep;
        continue;
    }
  }
}

}  // namespace pdgate::policy::pattern
