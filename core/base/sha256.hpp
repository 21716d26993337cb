// SHA-256 (OpenSSL's libcrypto), incremental and forkable. Conversation
// keys and history fingerprints use it (core/routing/turn_history.hpp): a keyed
// store must not reveal whose entry a key is, and a client must not be
// able to forge another history with the same fingerprint, so a
// non-cryptographic hash will not do.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

// OpenSSL's context type, without including OpenSSL's headers everywhere.
struct evp_md_ctx_st;

namespace pdgate {

using Sha256Digest = std::array<unsigned char, 32>;

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&& other) noexcept;
  Sha256& operator=(Sha256&& other) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  // A second hasher that continues from this one's state: two texts that
  // share a prefix are hashed with one pass over the prefix.
  Sha256 fork() const;

  void update(std::string_view bytes);
  // Eight bytes, big-endian: lengths that keep a concatenation of fields
  // unambiguous.
  void update_u64(std::uint64_t v);

  // The digest of everything fed; the hasher is spent afterwards. Nullopt
  // when libcrypto failed at any step (it only can when out of memory):
  // callers then treat the text as one they cannot fingerprint.
  std::optional<Sha256Digest> finish();

 private:
  evp_md_ctx_st* ctx_ = nullptr;  // null once failed or spent
};

// Lowercase hex of a digest (64 characters).
std::string to_hex(const Sha256Digest& d);

// Lowercase hex SHA-256 of `bytes`; nullopt when libcrypto failed.
std::optional<std::string> sha256_hex(std::string_view bytes);

}  // namespace pdgate
