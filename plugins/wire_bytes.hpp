// Fixed-width little-endian integers for the binary records replicas
// exchange through Redis (kv_index_wire, load_sync_wire): a writer, and a
// reader that never reads past its input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace pdgate::wire {

template <typename T>
void put(std::string& out, T v) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  auto u = static_cast<U>(v);
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>(u & 0xff));
    u = static_cast<U>(u >> 8);
  }
}

// Reads fixed-width little-endian integers; any read past the end sets
// `bad` and yields 0, so a parse checks once per record.
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  template <typename T>
  T get() {
    using U = std::make_unsigned_t<T>;
    if (s_.size() - pos_ < sizeof(T)) {
      bad_ = true;
      pos_ = s_.size();
      return 0;
    }
    U u = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i)
      u |= static_cast<U>(static_cast<U>(static_cast<unsigned char>(s_[pos_ + i])) << (8 * i));
    pos_ += sizeof(T);
    return static_cast<T>(u);
  }
  std::string_view bytes(std::size_t n) {
    if (s_.size() - pos_ < n) {
      bad_ = true;
      pos_ = s_.size();
      return {};
    }
    auto v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::size_t left() const { return s_.size() - pos_; }
  bool bad() const { return bad_; }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;
  bool bad_ = false;
};

}  // namespace pdgate::wire
