#include "core/base/json_edit.hpp"

#include <algorithm>
#include <utility>

namespace pdgate {

JsonBodyEditor::JsonBodyEditor(std::string_view text, const JsonObjectIndex& index)
    : text_(text), index_(&index) {}

void JsonBodyEditor::add(Edit e) {
  // The connectors' bodies make up to eight edits: one allocation, made
  // only when an edit is (a body passed through unchanged makes none).
  if (edits_.empty())
    edits_.reserve(8);
  edits_.push_back(std::move(e));
}

void JsonBodyEditor::set(std::string_view key, std::string raw_value) {
  for (auto& e : edits_) {
    if (e.key == key) {
      e.value = std::move(raw_value);
      return;
    }
  }
  add(Edit{std::string(key), std::move(raw_value)});
}

void JsonBodyEditor::remove(std::string_view key) {
  for (auto& e : edits_) {
    if (e.key == key) {
      e.value.reset();
      return;
    }
  }
  // Removing a member the body does not have changes nothing: no edit.
  if (!raw_member(text_, *index_, key))
    return;
  add(Edit{std::string(key), std::nullopt});
}

const JsonBodyEditor::Edit* JsonBodyEditor::find_edit(std::string_view key) const {
  for (const auto& e : edits_) {
    if (e.key == key)
      return &e;
  }
  return nullptr;
}

template <class Original, class Fragment>
void JsonBodyEditor::walk(Original&& original, Fragment&& fragment) const {
  if (edits_.empty()) {
    original(0, text_.size());  // unchanged: no per-member bookkeeping
    return;
  }
  const auto& members = index_->members;
  // What happens to each original member: kept verbatim, kept with a new
  // value (first occurrence of a set key) or dropped.
  enum class Fate : std::uint8_t { keep, replace, drop };
  std::vector<Fate> fate(members.size(), Fate::keep);
  std::vector<bool> edit_placed(edits_.size(), false);
  for (std::size_t i = 0; i < members.size(); ++i) {
    const Edit* e = find_edit(members[i].key);
    if (e == nullptr)
      continue;
    const auto slot = static_cast<std::size_t>(e - edits_.data());
    if (!e->value || edit_placed[slot]) {
      fate[i] = Fate::drop;
    } else {
      fate[i] = Fate::replace;
      edit_placed[slot] = true;
    }
  }

  const std::size_t prefix_end = members.empty() ? index_->close_brace : members.front().begin;
  original(0, prefix_end);
  bool first = true;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (fate[i] == Fate::drop)
      continue;
    const JsonMember& m = members[i];
    // A member's own leading separator (`ws , ws` after the previous
    // member) holds exactly one comma, so it stays correct when the
    // previous member was dropped. The first kept member follows the
    // object's prefix directly instead.
    if (!first)
      original(members[i - 1].end, m.begin);
    first = false;
    if (fate[i] == Fate::keep) {
      original(m.begin, m.end);
    } else {
      original(m.begin, m.value_begin);
      fragment(std::string_view(*find_edit(m.key)->value));
      original(m.value_end, m.end);
    }
  }
  for (std::size_t k = 0; k < edits_.size(); ++k) {
    if (!edits_[k].value || edit_placed[k])
      continue;
    if (!first)
      fragment(std::string_view(","));
    first = false;
    fragment(std::string_view(json_quote(edits_[k].key)));
    fragment(std::string_view(":"));
    fragment(std::string_view(*edits_[k].value));
  }
  const std::size_t suffix_begin = members.empty() ? index_->close_brace : members.back().end;
  original(suffix_begin, text_.size());
}

std::string JsonBodyEditor::render() const {
  // The layout is walked twice: once to size the output and once to fill
  // it, so the body is allocated exactly once.
  std::size_t total = 0;
  walk([&](std::size_t b, std::size_t e) { total += e - b; },
       [&](std::string_view piece) { total += piece.size(); });
  std::string out;
  out.reserve(total);
  walk([&](std::size_t b, std::size_t e) { out.append(text_.substr(b, e - b)); },
       [&](std::string_view piece) { out.append(piece); });
  return out;
}

SplicedText JsonBodyEditor::splice() const {
  SplicedText out;
  out.original_ = text_;
  walk([&](std::size_t b, std::size_t e) { out.add_original(b, e - b); },
       [&](std::string_view piece) { out.add_fragment(piece); });
  return out;
}

SplicedText::SplicedText(std::string_view original) : original_(original) {
  add_original(0, original.size());
}

void SplicedText::add_original(std::size_t begin, std::size_t size) {
  if (size == 0)
    return;
  size_ += size;
  // Kept members lie next to each other in the original: one piece.
  if (!pieces_.empty() && !pieces_.back().fragment &&
      pieces_.back().begin + pieces_.back().size == begin) {
    pieces_.back().size += size;
    return;
  }
  pieces_.push_back(Piece{false, begin, size});
}

void SplicedText::add_fragment(std::string_view bytes) {
  if (bytes.empty())
    return;
  size_ += bytes.size();
  const std::size_t begin = fragments_.size();
  fragments_.append(bytes);
  if (!pieces_.empty() && pieces_.back().fragment &&
      pieces_.back().begin + pieces_.back().size == begin) {
    pieces_.back().size += bytes.size();
    return;
  }
  pieces_.push_back(Piece{true, begin, bytes.size()});
}

std::string SplicedText::str() const {
  std::string out;
  out.reserve(size_);
  for_each([&](std::string_view piece) { out.append(piece); });
  return out;
}

}  // namespace pdgate
