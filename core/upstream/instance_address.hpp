// Whether two instance addresses are the same engine: `localhost:8200`
// and `127.0.0.1:8200` are written differently but reach one process, and
// routing to it twice would double its share of the traffic. Names are
// resolved with Asio's asynchronous resolver, each bounded by a deadline,
// so no event loop ever waits on DNS. A name that does not resolve is
// compared as written (the health checks judge whether it serves).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/address.hpp>

#include "core/config/config.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

// The addresses `host` stands for: itself when it is an IP literal, else
// what the resolver answers before `deadline` (empty when it does not
// resolve). IPv4-mapped IPv6 addresses are given as IPv4.
boost::asio::awaitable<std::vector<boost::asio::ip::address>> resolve_host(
    boost::asio::any_io_executor ex, const std::string& host, std::uint16_t port,
    std::chrono::steady_clock::time_point deadline);

// One message per instance of a role's list that is, once resolved, the
// same address and port as an earlier one of that list.
boost::asio::awaitable<std::vector<std::string>> resolved_duplicates(
    boost::asio::any_io_executor ex, const Config& cfg,
    std::chrono::steady_clock::time_point deadline);

// The registered instance, in a role overlapping `spec`'s, that resolves
// to an address and port `spec` resolves to; nullptr when there is none.
boost::asio::awaitable<InstancePtr> same_address_instance(
    boost::asio::any_io_executor ex, const InstanceSet& set, const UpstreamSpec& spec,
    std::chrono::steady_clock::time_point deadline);

}  // namespace pdgate
