// Edits of a JSON request body without a DOM (core/base/json_body.hpp
// says why): the few top-level members pdgate changes are spliced into the
// client's text, and the result is rendered once or sent as a sequence of
// slices of the original.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/json_body.hpp"

namespace pdgate {

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

}  // namespace pdgate
