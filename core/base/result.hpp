// Errors are values on the data path: parsers and rewriters return
// Result<T> instead of throwing, and the caller decides what HTTP answer a
// failure becomes (see core/net/errors.hpp).
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace pdgate {

struct Failure {
  std::string message;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Failure f) : v_(std::move(f)) {}    // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const std::string& error() const { return std::get<1>(v_).message; }

 private:
  std::variant<T, Failure> v_;
};

inline Failure fail(std::string message) {
  return Failure{std::move(message)};
}

}  // namespace pdgate
