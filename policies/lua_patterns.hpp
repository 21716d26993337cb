// Lua 5.1 patterns (string.find/match/gmatch/gsub) with a bounded cost.
//
// Stock Lua matches a pattern in one C call that cannot be interrupted, and
// backtracking makes that call exponential in the worst case
// (`(".-"):rep(4) .. "b"` on 100 kB of "a"). This matcher has the same
// semantics as LuaJIT's, but counts its steps and asks a callback every
// kCheckSteps steps whether to go on, so the sandbox can stop it at the
// policy's deadline. It has no Lua dependency; the string library bindings
// are in lua_bounded_lib.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pdgate::policy::pattern {

// Lua's LUA_MAXCAPTURES.
constexpr int kMaxCaptures = 32;
// Nesting of match calls (pattern items that backtrack, captures); LuaJIT
// has the same limit (LJ_MAX_XLEVEL) and says "pattern too complex".
constexpr int kMaxDepth = 200;
// Steps between two calls of the `keep_going` callback: a step is a few
// nanoseconds, so the callback (which reads a clock) runs every ~10 µs.
constexpr std::uint32_t kCheckSteps = 4096;

// A capture's length when it is a position capture `()` or still open.
constexpr std::ptrdiff_t kCapPosition = -2;
constexpr std::ptrdiff_t kCapUnfinished = -1;

struct Capture {
  const char* init = nullptr;
  std::ptrdiff_t len = 0;
};

// Whether a pattern has any magic character, i.e. whether find may do a
// plain search (NUL-terminated, as in LuaJIT).
bool has_specials(const char* pattern);

// Returns whether to continue; called every kCheckSteps steps.
using KeepGoing = bool (*)(void* user);

class Matcher {
 public:
  // `subject` is [src, src + len); `pattern` is NUL-terminated (an embedded
  // NUL ends it, as in LuaJIT).
  Matcher(const char* src, std::size_t len, KeepGoing keep_going, void* user)
      : src_init_(src), src_end_(src + len), keep_going_(keep_going), user_(user) {}

  // Tries to match `pattern` at `s`; the end of the match, or nullptr when
  // there is none or the match stopped (then failed() is true).
  const char* match(const char* s, const char* pattern);

  // Stopped by an error in the pattern (error() says which) or because
  // keep_going said no (stopped() is true).
  bool failed() const { return failed_; }
  bool stopped() const { return stopped_; }
  const char* error() const { return error_; }

  int level() const { return level_; }
  const Capture& capture(int i) const { return capture_[i]; }
  const char* subject() const { return src_init_; }
  const char* subject_end() const { return src_end_; }

  // Forgets the captures before the next match attempt.
  void reset() {
    level_ = 0;
    depth_ = 0;
  }

  // Counts `n` steps of work done by the caller (e.g. copying a
  // replacement); false once the match must stop.
  bool charge(std::size_t n);

 private:
  const char* do_match(const char* s, const char* p);
  const char* class_end(const char* p);
  bool single_match(unsigned char c, const char* p, const char* ep);
  bool match_bracket_class(unsigned char c, const char* p, const char* ec);
  const char* match_balance(const char* s, const char* p);
  const char* max_expand(const char* s, const char* p, const char* ep);
  const char* min_expand(const char* s, const char* p, const char* ep);
  const char* start_capture(const char* s, const char* p, std::ptrdiff_t what);
  const char* end_capture(const char* s, const char* p);
  const char* match_capture(const char* s, int l);
  const char* fail(const char* message);
  bool tick() { return ++steps_ < kCheckSteps ? !failed_ : charge(0); }

  const char* src_init_;
  const char* src_end_;
  KeepGoing keep_going_;
  void* user_;
  int level_ = 0;
  int depth_ = 0;
  std::uint32_t steps_ = 0;
  bool failed_ = false;
  bool stopped_ = false;
  const char* error_ = "";  // a string literal
  Capture capture_[kMaxCaptures];
};

}  // namespace pdgate::policy::pattern
