// The DNS client's messages (plugins/dns_client.*): queries as RFC 1035
// writes them, answers parsed without reading past their end.
#include "plugins/dns_client.hpp"

#include <gtest/gtest.h>

namespace pdgate {
namespace {

std::string u16(unsigned v) {
  return {static_cast<char>(v >> 8), static_cast<char>(v & 0xff)};
}

// An answer to query `id` with the question for `name` and `records`
// (each: type, rdata), names in answers compressed to the question's.
std::string answer(unsigned id, unsigned flags, const std::string& qname,
                   const std::vector<std::pair<unsigned, std::string>>& records) {
  std::string m = u16(id) + u16(flags) + u16(1) + u16(records.size()) + u16(0) + u16(0);
  m += qname + u16(1) + u16(1);
  for (const auto& [type, rdata] : records)
    m += u16(0xc00c) + u16(type) + u16(1) + u16(0) + u16(30) + u16(rdata.size()) + rdata;
  return m;
}

const std::string kQname = std::string("\x07prefill\x04test", 13) + '\0';

// A query is a header with one question, labels length-prefixed.
TEST(DnsMessages, Query) {
  auto q = dns_query(0x1234, "prefill.test.", DnsType::a);
  ASSERT_TRUE(q) << q.error();
  EXPECT_EQ(
      *q, u16(0x1234) + u16(0x0100) + u16(1) + u16(0) + u16(0) + u16(0) + kQname + u16(1) + u16(1));
  EXPECT_FALSE(dns_query(1, "", DnsType::a));
  EXPECT_FALSE(dns_query(1, "a..b", DnsType::a));
  EXPECT_FALSE(dns_query(1, std::string(64, 'x') + ".test", DnsType::a));
}

// A and AAAA records become addresses; a CNAME on the way is skipped.
TEST(DnsMessages, Addresses) {
  auto a = dns_parse_response(answer(7, 0x8180, kQname,
                                     {{5, std::string("\x01x\0", 3)},
                                      {1, std::string("\x7f\x00\x00\x02", 4)},
                                      {1, std::string("\x0a\x00\x00\x05", 4)}}),
                              7, DnsType::a);
  ASSERT_TRUE(a) << a.error();
  EXPECT_EQ(a->addresses, (std::vector<std::string>{"127.0.0.2", "10.0.0.5"}));
  EXPECT_FALSE(a->no_such_name);
  std::string v6(16, '\0');
  v6[15] = 1;
  auto aaaa = dns_parse_response(answer(8, 0x8180, kQname, {{28, v6}}), 8, DnsType::aaaa);
  ASSERT_TRUE(aaaa) << aaaa.error();
  EXPECT_EQ(aaaa->addresses, (std::vector<std::string>{"::1"}));
}

// NXDOMAIN is an answer (no instances); other errors, other ids,
// truncation and short or malformed messages are failures.
TEST(DnsMessages, ErrorsAndMalformed) {
  auto nx = dns_parse_response(answer(9, 0x8183, kQname, {}), 9, DnsType::a);
  ASSERT_TRUE(nx) << nx.error();
  EXPECT_TRUE(nx->no_such_name);
  EXPECT_TRUE(nx->addresses.empty());
  EXPECT_FALSE(dns_parse_response(answer(9, 0x8182, kQname, {}), 9, DnsType::a));  // SERVFAIL
  EXPECT_FALSE(dns_parse_response(answer(9, 0x8180, kQname, {}), 10, DnsType::a));
  EXPECT_FALSE(dns_parse_response(answer(9, 0x8380, kQname, {}), 9, DnsType::a));  // TC
  EXPECT_FALSE(dns_parse_response(answer(9, 0x0100, kQname, {}), 9, DnsType::a));  // a query
  const std::string whole = answer(9, 0x8180, kQname, {{1, std::string("\x7f\x00\x00\x01", 4)}});
  for (std::size_t n = 0; n < whole.size(); ++n)
    EXPECT_FALSE(dns_parse_response(whole.substr(0, n), 9, DnsType::a)) << n;
  EXPECT_FALSE(dns_parse_response(answer(9, 0x8180, kQname, {{1, "\x7f\x00"}}), 9, DnsType::a));
}

// resolv.conf's first nameserver line, comments and options ignored.
TEST(DnsMessages, FirstNameserver) {
  EXPECT_EQ(first_nameserver("# c\nsearch x\nnameserver 10.0.0.2 # dc\nnameserver 1.1.1.1\n"),
            "10.0.0.2");
  EXPECT_EQ(first_nameserver("nameserver\tfd00::53\n"), "fd00::53");
  EXPECT_EQ(first_nameserver("nameservers 1.2.3.4\n"), "");
  EXPECT_EQ(first_nameserver(""), "");
}

}  // namespace
}  // namespace pdgate
