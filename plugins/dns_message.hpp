// DNS messages (RFC 1035) for instance discovery: the query pdgate sends
// and the answer it reads, as pure functions (unit-tested and fuzzed). The
// exchange itself is plugins/dns_client.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/result.hpp"

namespace pdgate {

enum class DnsType : std::uint16_t { a = 1, aaaa = 28 };

// A query for `name` (no trailing dot needed) with recursion desired.
// Fails for a name that is not a valid DNS name (label > 63, name > 253).
Result<std::string> dns_query(std::uint16_t id, std::string_view name, DnsType type);

struct DnsAnswer {
  // NXDOMAIN: the name does not exist (an empty set of instances), as
  // opposed to a failure (the set is not known).
  bool no_such_name = false;
  std::vector<std::string> addresses;  // text form, e.g. "10.0.0.5", "fd00::1"
};

// Parses a response to query `id` for `type`: the addresses of the
// answer section's records of that type (CNAMEs are followed as the server
// already did: every record of the type counts). Fails on a malformed
// message, another id, a truncated answer, or an error code other than
// NXDOMAIN.
Result<DnsAnswer> dns_parse_response(std::string_view message, std::uint16_t id, DnsType type);

// "nameserver ADDR" lines of resolv.conf: the first one, or empty.
std::string first_nameserver(std::string_view resolv_conf);

}  // namespace pdgate
