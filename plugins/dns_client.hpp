// A small asynchronous DNS client (RFC 1035 over UDP) for instance
// discovery: A and AAAA lookups against one server, on an Asio executor.
// getaddrinfo would block a thread per lookup and cannot be pointed at a
// given server; a headless Kubernetes Service is one UDP exchange.
//
// The message format is plugins/dns_message.hpp; the exchange is one
// datagram out, one back, with a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "core/base/result.hpp"
#include "plugins/dns_message.hpp"

namespace pdgate {

// Why a lookup got no answer, as pdgate_dns_lookup_failures_total counts
// it: nothing within the timeout, a socket error (ICMP port unreachable
// included: no server listens), an answer with an error code other than
// NXDOMAIN (REFUSED, SERVFAIL), an answer that does not parse.
enum class DnsFailure { timeout, network, server_error, malformed };
inline constexpr int kDnsFailureKinds = 4;
const char* to_string(DnsFailure f);

struct DnsLookup {
  Result<DnsAnswer> answer;
  DnsFailure failure = DnsFailure::network;  // when !answer
};

// One lookup: the query to `server` (an address) on `port` over UDP, its
// answer within `timeout`.
boost::asio::awaitable<DnsLookup> dns_lookup(boost::asio::any_io_executor ex, std::string server,
                                             std::uint16_t port, std::string name, DnsType type,
                                             std::chrono::milliseconds timeout);

}  // namespace pdgate
