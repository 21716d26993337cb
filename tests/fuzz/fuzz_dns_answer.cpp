// DNS answers as the discovery client parses them (plugins/dns_message.cpp):
// whatever a server (or anyone who can reach the client's port) sends,
// parsing never reads past the message, and every address it yields is
// one Asio reads back as the same address.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <boost/asio/ip/address.hpp>

#include "plugins/dns_message.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2)
    return 0;
  // The first two bytes are the id the client waits for (an answer to
  // another id is refused), the rest the datagram.
  const auto id = static_cast<std::uint16_t>(data[0] << 8 | data[1]);
  const std::string_view msg(reinterpret_cast<const char*>(data) + 2, size - 2);
  for (auto type : {pdgate::DnsType::a, pdgate::DnsType::aaaa}) {
    auto r = pdgate::dns_parse_response(msg, id, type);
    if (!r)
      continue;
    for (const auto& a : r->addresses) {
      boost::system::error_code ec;
      const auto parsed = boost::asio::ip::make_address(a, ec);
      if (ec || parsed.to_string() != a || parsed.is_v4() != (type == pdgate::DnsType::a)) {
        std::fprintf(stderr, "address '%s' does not read back\n", a.c_str());
        std::abort();
      }
    }
    if (r->no_such_name && !r->addresses.empty())
      std::abort();
  }
  return 0;
}
