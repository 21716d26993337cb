// Request bodies reach 64 MiB and every one of them is rewritten (prefill
// and decode copies), so the gateway never builds a DOM for a body: it
// validates the text in one linear pass, remembers where each top-level
// member lies, and splices the few fields it changes. Bytes it does not
// touch (prompts, images, unknown fields) are copied verbatim, which also
// keeps multimodal items byte-identical for the encoder cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/result.hpp"

namespace pdgate {

// JSON's whitespace (RFC 8259): space, tab, line feed, carriage return.
// Most bytes are above the space: one comparison decides for them.
inline bool is_json_ws(char c) {
  return static_cast<unsigned char>(c) <= ' ' && (c == ' ' || c == '\t' || c == '\n' || c == '\r');
}

// Nesting deeper than this is rejected: it bounds the validator's memory
// and matches what common JSON parsers (Python's included) tolerate.
inline constexpr std::size_t kMaxJsonDepth = 512;

// One top-level member of the object.
struct JsonMember {
  std::string key;  // decoded key ("max\u005ftokens" is stored as max_tokens)
  // Byte range of `"key": value` (no comma, no surrounding whitespace).
  std::size_t begin = 0;
  std::size_t end = 0;
  // Byte range of the raw value text.
  std::size_t value_begin = 0;
  std::size_t value_end = 0;
};

struct JsonObjectIndex {
  std::vector<JsonMember> members;  // in text order, duplicates included
  std::size_t open_brace = 0;       // offset of the opening '{'
  std::size_t close_brace = 0;      // offset of the final '}'
};

// Validates the whole text strictly per RFC 8259 (escapes, \u surrogate
// pairs, number grammar, nesting up to kMaxJsonDepth, UTF-8 validity, only
// whitespace after the value) in one linear pass and indexes the top-level
// members. Fails unless the top level is an object. The error message says
// what is wrong and at which byte offset.
Result<JsonObjectIndex> index_json_object(std::string_view text);

// Validates any JSON text (not only objects) with the same rules.
Result<bool> validate_json(std::string_view text);

// Raw value text of the last member named `key` (duplicate keys: the last
// wins, as in most parsers), if any. `text` must be the indexed text.
std::optional<std::string_view> raw_member(std::string_view text, const JsonObjectIndex& index,
                                           std::string_view key);

// The member's value when it is `true` or `false`; nullopt otherwise.
std::optional<bool> bool_member(std::string_view text, const JsonObjectIndex& index,
                                std::string_view key);

// The member's decoded value when it is a JSON string; nullopt otherwise.
std::optional<std::string> string_member(std::string_view text, const JsonObjectIndex& index,
                                         std::string_view key);

// A whole number as Python's request models (pydantic, as vLLM uses them)
// read an integer field from a validated raw JSON value: an integer
// literal, a number with an integral value however written (100.0, 1e2,
// 1.0E+2), or a string holding an integer literal ("100"). Nullopt for a
// fraction, a value outside int64, or any other type.
std::optional<std::int64_t> integral_value(std::string_view raw);

// The elements of a JSON array text, one at a time, as the raw text of
// each (no surrounding whitespace), without building anything: a chat's
// `messages` are compared element by element as the client sent them.
// Each element is validated as it is reached; next() returns false at the
// end of the array, and failed() tells a malformed text (or one that is
// not an array) from the end.
class JsonArrayElements {
 public:
  explicit JsonArrayElements(std::string_view raw_array) : text_(raw_array) {}
  bool next(std::string_view& element);
  bool failed() const { return state_ == State::failed; }

 private:
  enum class State { start, element, done, failed };
  std::string_view text_;
  std::size_t pos_ = 0;
  State state_ = State::start;
};

// One step of a path into a JSON value: an object member by name, or an
// array element by position (0-based).
struct JsonPathStep {
  std::string_view key;  // when !is_index
  std::size_t index = 0;
  bool is_index = false;
};
// Paths go at most this deep (a policy's req:body_field).
inline constexpr std::size_t kMaxJsonPathSteps = 16;

// The raw text (no surrounding whitespace) at `path` inside the JSON value
// `raw`, read as the steps go, nothing built: an object's member (the last
// of that name), an array's element. Nullopt when a step names nothing (no
// such member, a position past the end, a name into an array or a
// position into anything else), the path is longer than kMaxJsonPathSteps,
// or the text is not valid JSON where a step reads it. `tick(user)`, when
// given, is called every 4096 array elements skipped (a caller's budget
// check; it may unwind).
using JsonScanTick = void (*)(void* user);
std::optional<std::string_view> raw_at_path(std::string_view raw, const JsonPathStep* path,
                                            std::size_t steps, JsonScanTick tick = nullptr,
                                            void* user = nullptr);

// Decodes a JSON string literal (quotes included) that index_json_object
// accepted. Returns nullopt if `literal` is not a valid string literal.
std::optional<std::string> decode_json_string(std::string_view literal);

// Appends the decoded value of a JSON string literal (quotes included) to
// `out`. False, with `out` as it was, when `literal` is not a valid string
// literal.
bool append_json_string(std::string_view literal, std::string& out);

// A JSON string literal for `s`: quotes, backslashes and control characters
// are escaped; bytes that are not valid UTF-8 become U+FFFD so the output
// is always valid JSON.
std::string json_quote(std::string_view s);

}  // namespace pdgate
