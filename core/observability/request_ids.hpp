// A worker's request ids: random UUIDs (version 4, RFC 4122 variant) for
// X-Request-Id and the cluster calls, and runs of hex digits for the ids
// p2p-nccl and the encoder's children carry. One generator per worker,
// seeded once from the OS, so making an id takes no lock and no system
// call; it formats the 16 bytes itself (boost's generator and to_string
// took ~900 instructions per request, a fiftieth of a one-hop request).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/base/id_rng.hpp"

namespace pdgate {

class RequestIds {
 public:
  RequestIds() = default;
  explicit RequestIds(std::uint64_t seed) : rng_(seed) {}

  // "xxxxxxxx-xxxx-4xxx-Nxxx-xxxxxxxxxxxx", lower-case, N one of 8 9 a b.
  std::string uuid();
  // The same 32 digits without the dashes (uuid4().hex in Python).
  std::string uuid_hex();
  // `n` (at most 32) random lower-case hex digits.
  std::string hex(std::size_t n);

 private:
  std::array<std::uint8_t, 16> next_uuid_bytes();

  IdRng rng_;
};

}  // namespace pdgate
