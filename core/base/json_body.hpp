// Request bodies reach 64 MiB and every one of them is rewritten (prefill
// and decode copies), so the gateway never builds a DOM for a body: it
// validates the text in one linear pass, remembers where each top-level
// member lies, and splices the few fields it changes. Bytes it does not
// touch (prompts, images, unknown fields) are copied verbatim, which also
// keeps multimodal items byte-identical for the encoder cache.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/result.hpp"

namespace pdgate {

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

// Decodes a JSON string literal (quotes included) that index_json_object
// accepted. Returns nullopt if `literal` is not a valid string literal.
std::optional<std::string> decode_json_string(std::string_view literal);

// A JSON string literal for `s`: quotes, backslashes and control characters
// are escaped; bytes that are not valid UTF-8 become U+FFFD so the output
// is always valid JSON.
std::string json_quote(std::string_view s);

// An edited text that shares the bytes of the original: the edited text is
// the concatenation of its pieces, each either a slice of the original or
// one of the few small fragments the edit made (new values, separators).
// A 1 MiB prompt is then sent upstream from the client's own buffer, as a
// buffer sequence, instead of being copied once per upstream request. The
// original text must outlive it; moving it keeps its pieces valid.
class SplicedText {
 public:
  SplicedText() = default;
  // A text with no edits: all of `original`.
  explicit SplicedText(std::string_view original);

  // Bytes in the edited text.
  std::size_t size() const { return size_; }
  std::size_t piece_count() const { return pieces_.size(); }
  // Visits the pieces in order as string_views (none empty).
  template <class F>
  void for_each(F&& f) const {
    for (const Piece& p : pieces_) {
      f(p.fragment ? std::string_view(fragments_).substr(p.begin, p.size)
                   : original_.substr(p.begin, p.size));
    }
  }
  // The edited text as one string (a copy).
  std::string str() const;

 private:
  friend class JsonBodyEditor;
  struct Piece {
    bool fragment = false;  // in fragments_, else in original_
    std::size_t begin = 0;
    std::size_t size = 0;
  };
  void add_original(std::size_t begin, std::size_t size);
  void add_fragment(std::string_view bytes);

  std::string_view original_;
  // Offsets, not pointers, into fragments_: a short string's bytes move
  // with the object.
  std::string fragments_;
  std::vector<Piece> pieces_;
  std::size_t size_ = 0;
};

// Collects edits of top-level members and renders the edited body once,
// with one allocation of the right size. The text and the index must
// outlive the editor. Values passed to set() must be valid JSON: they are
// spliced in as they are.
class JsonBodyEditor {
 public:
  JsonBodyEditor(std::string_view text, const JsonObjectIndex& index);

  // Replaces every member named `key`: the first occurrence keeps its
  // position (and its key spelling), later duplicates are dropped. Appends
  // the member at the end of the object when there is none.
  void set(std::string_view key, std::string raw_value);

  // Removes every member named `key`.
  void remove(std::string_view key);

  // The edited text: valid JSON whenever the input and the set() values
  // are; bytes outside edited members are copied verbatim. Later edits of
  // the same key override earlier ones.
  std::string render() const;

  // The same text as render(), as slices of the original plus the edited
  // fragments: no copy of the untouched bytes.
  SplicedText splice() const;

 private:
  struct Edit {
    std::string key;
    std::optional<std::string> value;  // nullopt: remove
  };
  const Edit* find_edit(std::string_view key) const;
  void add(Edit e);
  // Walks the edited layout: `original(begin, end)` for a slice of the
  // text, `fragment(bytes)` for new bytes (valid only during the call).
  template <class Original, class Fragment>
  void walk(Original&& original, Fragment&& fragment) const;

  std::string_view text_;
  const JsonObjectIndex* index_;
  std::vector<Edit> edits_;
};

// `json_text` without its top-level member `key`; nullopt when the text has
// no such member or is not a valid JSON object (then there is nothing to
// strip and the caller forwards the text unchanged).
std::optional<std::string> strip_member(std::string_view json_text, std::string_view key);

}  // namespace pdgate
