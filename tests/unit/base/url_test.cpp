#include "core/base/url.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pdgate {
namespace {

// Expects `text` refused with a message holding `fragment` and never `secret`.
void expect_refused(std::string_view text, std::string_view fragment,
                    std::string_view secret = "secretpw") {
  const auto u = parse_url(text, HostList::many);
  ASSERT_FALSE(u.ok()) << "accepted: " << text;
  EXPECT_NE(u.error().find(fragment), std::string::npos) << text << ": " << u.error();
  EXPECT_EQ(u.error().find(secret), std::string::npos) << text << ": " << u.error();
}

// A bare authority, vLLM's http://:8100 and a full URL all parse; the
// scheme is lower-cased and empty when none was written.
TEST(Url, BareAuthorityAndSchemeForms) {
  auto u = parse_url("engine-1.local:8100");
  ASSERT_TRUE(u) << u.error();
  EXPECT_EQ(u->scheme, "");
  ASSERT_EQ(u->hosts.size(), 1u);
  EXPECT_EQ(u->hosts[0].host, "engine-1.local");
  EXPECT_EQ(u->hosts[0].port, 8100);

  u = parse_url("http://:8100");
  ASSERT_TRUE(u) << u.error();
  EXPECT_EQ(u->hosts[0].host, "");
  EXPECT_EQ(u->hosts[0].port, 8100);

  u = parse_url("HTTP://c:4318/v1/traces?x=1#f");
  ASSERT_TRUE(u) << u.error();
  EXPECT_EQ(u->scheme, "http");
  EXPECT_EQ(u->path, "/v1/traces");
  EXPECT_EQ(u->query, "x=1");
  EXPECT_EQ(u->fragment, "f");

  // An empty port is no port (RFC 3986 section 6.2.3).
  u = parse_url("redis://h:");
  ASSERT_TRUE(u) << u.error();
  EXPECT_FALSE(u->hosts[0].port.has_value());
}

// User and password are percent-decoded: "%40" is an '@' in a password.
TEST(Url, PercentEncodedUserInfo) {
  auto u = parse_url("redis://:p%40ss@host");
  ASSERT_TRUE(u) << u.error();
  EXPECT_TRUE(u->has_userinfo);
  EXPECT_EQ(u->user, "");
  EXPECT_EQ(u->password, "p@ss");
  EXPECT_EQ(u->hosts[0].host, "host");

  u = parse_url("redis://us%3Aer:p%3As%2Fs@h:1");
  ASSERT_TRUE(u) << u.error();
  EXPECT_EQ(u->user, "us:er");
  EXPECT_EQ(u->password, "p:s/s");

  // Without ':' the user info is a user alone, no password.
  u = parse_url("redis://only@h");
  ASSERT_TRUE(u) << u.error();
  EXPECT_EQ(u->user, "only");
  EXPECT_FALSE(u->password.has_value());
}

// IPv6 hosts lose their brackets, with or without a scheme, and
// host_port() puts them back.
TEST(Url, Ipv6Hosts) {
  for (const char* text : {"[::1]:8000", "http://[::1]:8000/", "redis://:pw@[::1]:8000/0"}) {
    const auto u = parse_url(text);
    ASSERT_TRUE(u) << text << ": " << u.error();
    EXPECT_EQ(u->hosts[0].host, "::1") << text;
    EXPECT_TRUE(u->hosts[0].ipv6) << text;
    EXPECT_EQ(u->hosts[0].port, 8000) << text;
  }
  EXPECT_EQ(host_port("::1", 8000), "[::1]:8000");
  EXPECT_EQ(host_port("10.0.0.1", 80), "10.0.0.1:80");
}

// Garbage is refused with the part at fault named: spaces, control
// characters, bad ports, bad IPv6 literals, bad escapes, bad host names.
TEST(Url, RejectsGarbageNamingThePart) {
  expect_refused("bad host:1", "a space in the host");
  expect_refused("http://h:1/a b", "a space in the path");
  expect_refused("http://h\t:1", "a control character in the host");
  expect_refused("http://h\xc3\xa4:1", "non-ASCII");
  expect_refused("h:0", "invalid port '0' (expected 1-65535)");
  expect_refused("h:65536", "invalid port '65536'");
  expect_refused("h:99999999999999999999", "invalid port");
  expect_refused("h:8x", "invalid port '8x'");
  expect_refused("http://h:1x/", "invalid port '1x'");
  expect_refused("::1:8100", "brackets");
  expect_refused("http://a:b:c", "brackets");
  expect_refused("[::1:8100", "missing ']'");
  expect_refused("[zz]:1", "invalid IPv6 address 'zz'");
  expect_refused("[::1]x", "expected ':' and a port after ']'");
  expect_refused("http://[v1.x]:1", "unsupported address");
  expect_refused("http://a*b:1", "invalid host name 'a*b'");
  expect_refused("http://h%00:1", "invalid host name");
  expect_refused("http://h:1/%zz", "bad percent-escape in the path");
  expect_refused("http://h:1/{x}", "the character '{' in the path");
}

// A URL with user info may hold a password: no message repeats any of it,
// even when a misplaced character makes part of it look like a port.
TEST(Url, MessagesNeverRepeatThePassword) {
  expect_refused("redis://:secret@pw@h", "%40", "pw");
  expect_refused("redis://:secretpw%zz@h", "bad percent-escape in the user info");
  expect_refused("redis://:secretpw^@h", "the user info");
  expect_refused("redis://:secretpw @h", "a space in the user info");
  expect_refused("redis://:secr/etpw@h", "invalid port", "etpw");
  expect_refused("redis://:secretpw@h:99999", "invalid port");
}

// HostList::many reads comma-separated hosts, each with its own port;
// a comma before the '@' belongs to the password.
TEST(Url, HostList) {
  auto u = parse_url("redis+sentinel://:p,w@s1:26380,[::1],s3/mymaster/2?sentinel_password=x",
                     HostList::many);
  ASSERT_TRUE(u) << u.error();
  EXPECT_EQ(u->password, "p,w");
  ASSERT_EQ(u->hosts.size(), 3u);
  EXPECT_EQ(u->hosts[0].host, "s1");
  EXPECT_EQ(u->hosts[0].port, 26380);
  EXPECT_EQ(u->hosts[1].host, "::1");
  EXPECT_FALSE(u->hosts[1].port.has_value());
  EXPECT_EQ(u->hosts[2].host, "s3");
  EXPECT_EQ(u->path, "/mymaster/2");
  EXPECT_EQ(u->query, "sentinel_password=x");
  expect_refused("redis+sentinel://s1,s2:0/m", "host 2: invalid port '0'");
  expect_refused("redis+sentinel://s 1,s2/m", "host 1: a space in the host");
  // Without HostList::many a comma is no separator.
  EXPECT_FALSE(parse_url("redis://s1:1,s2:2/m"));
}

// Query items are key=value, values percent-decoded, '+' kept as is.
// A query that is a slice of a longer text (the admin API's request
// target) is read to its end and no further (under ASan: not one byte
// past the slice, SharedRegistry.AdminAddressesAnInstanceByUrlOnEitherReplica
// found Boost.URL reading on with strlen).
TEST(Url, QueryItemsOfASlice) {
  const std::string target = "/admin/instances/x?role=decode&more=1";
  // The slice alone on the heap, without a NUL after it.
  const auto slice = std::make_unique<char[]>(11);
  std::memcpy(slice.get(), target.data() + 19, 11);
  const auto q = query_items(std::string_view(slice.get(), 11));
  ASSERT_TRUE(q) << q.error();
  ASSERT_EQ(q->size(), 1u);
  EXPECT_EQ((*q)[0].first, "role");
  EXPECT_EQ((*q)[0].second, "decode");
}

TEST(Url, QueryItems) {
  auto q = query_items("db=2&password=p%20w+x");
  ASSERT_TRUE(q) << q.error();
  EXPECT_EQ(*q,
            (std::vector<std::pair<std::string, std::string>>{{"db", "2"}, {"password", "p w+x"}}));
  EXPECT_TRUE(query_items("")->empty());
  EXPECT_FALSE(query_items("a=1&&b=2"));
  EXPECT_FALSE(query_items("flag"));
}

// Passwords in the user info and in query items are masked; everything
// else stays readable.
TEST(Url, WithoutSecrets) {
  EXPECT_EQ(url_without_secrets("redis://user:pw@h:1/0"), "redis://user:***@h:1/0");
  EXPECT_EQ(url_without_secrets("redis://:pw@[::1]:6379"), "redis://:***@[::1]:6379");
  EXPECT_EQ(url_without_secrets("redis://pw@h"), "redis://***@h");
  EXPECT_EQ(url_without_secrets("redis://h:1"), "redis://h:1");
  EXPECT_EQ(url_without_secrets("unix:///run/r.sock?db=2&password=pw&user=u"),
            "unix:///run/r.sock?db=2&password=***&user=u");
  EXPECT_EQ(url_without_secrets("redis+sentinel://:pw@s1:26380,s2/m?sentinel_password=spw"),
            "redis+sentinel://:***@s1:26380,s2/m?sentinel_password=***");
  EXPECT_EQ(url_without_secrets("redis://:pw@bad host"), "(invalid URL)");
  EXPECT_EQ(url_without_secrets(""), "");
}

}  // namespace
}  // namespace pdgate
