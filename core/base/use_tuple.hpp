// The completion token of every coroutine in pdgate that treats an I/O
// error as a value: `auto [ec, n] = co_await op(..., use_tuple);`.
#pragma once

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace pdgate {

inline constexpr auto use_tuple = boost::asio::as_tuple(boost::asio::use_awaitable);

}  // namespace pdgate
