// One client API key: its name, labels and limits (core/pipeline/client_keys.hpp
// holds the key table and the limiters). Apart, so that what only reads a
// key (the policies' request hook) needs no networking headers.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace pdgate {

struct KeyLimits {
  double requests_per_second = 0;  // 0: no rate limit
  // Requests that may arrive at once above the rate (the bucket's size);
  // 0 means one second's worth (at least 1).
  double burst = 0;
  std::uint32_t concurrent = 0;         // 0: no limit
  std::uint64_t tokens_per_minute = 0;  // prompt + completion; 0: no limit
  bool any() const { return requests_per_second > 0 || concurrent > 0 || tokens_per_minute > 0; }
  double bucket() const;  // the burst actually used
  bool operator==(const KeyLimits&) const = default;
};

struct ClientKey {
  std::string name;
  std::map<std::string, std::string> labels;
  KeyLimits limits;
  bool operator==(const ClientKey&) const = default;
};

}  // namespace pdgate
