#include "core/base/sha256.hpp"

#include <openssl/evp.h>

#include <utility>

#include "core/base/hex.hpp"

namespace pdgate {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ != nullptr && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    ctx_ = nullptr;
  }
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(ctx_);
}

Sha256::Sha256(Sha256&& other) noexcept : ctx_(std::exchange(other.ctx_, nullptr)) {}

Sha256& Sha256::operator=(Sha256&& other) noexcept {
  if (this != &other) {
    EVP_MD_CTX_free(ctx_);
    ctx_ = std::exchange(other.ctx_, nullptr);
  }
  return *this;
}

Sha256 Sha256::fork() const {
  Sha256 copy;
  if (copy.ctx_ == nullptr)
    return copy;
  if (ctx_ == nullptr || EVP_MD_CTX_copy_ex(copy.ctx_, ctx_) != 1) {
    EVP_MD_CTX_free(copy.ctx_);
    copy.ctx_ = nullptr;
  }
  return copy;
}

void Sha256::update(std::string_view bytes) {
  if (ctx_ == nullptr || bytes.empty())
    return;
  if (EVP_DigestUpdate(ctx_, bytes.data(), bytes.size()) != 1) {
    EVP_MD_CTX_free(ctx_);
    ctx_ = nullptr;
  }
}

void Sha256::update_u64(std::uint64_t v) {
  char b[8];
  for (int i = 7; i >= 0; --i) {
    b[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  update(std::string_view(b, sizeof b));
}

std::optional<Sha256Digest> Sha256::finish() {
  if (ctx_ == nullptr)
    return std::nullopt;
  Sha256Digest d{};
  unsigned int n = 0;
  const bool ok = EVP_DigestFinal_ex(ctx_, d.data(), &n) == 1 && n == d.size();
  EVP_MD_CTX_free(ctx_);
  ctx_ = nullptr;
  if (!ok)
    return std::nullopt;
  return d;
}

std::string to_hex(const Sha256Digest& d) {
  std::string out(d.size() * 2, '0');
  hex_encode(d.data(), d.size(), out.data());
  return out;
}

std::optional<std::string> sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  auto d = h.finish();
  if (!d)
    return std::nullopt;
  return to_hex(*d);
}

}  // namespace pdgate
