// URLs as pdgate reads them: engine addresses (--prefill, --decode-servers-urls,
// the admin API, --dns-server), dns:// sources, the OTLP endpoint and Redis
// URLs. Boost.URL reads them (RFC 3986); this module adds the forms people
// write that are not strict URIs (a bare host:port, vLLM's http://:8100, a
// comma-separated list of hosts) and messages that say which part is wrong.
// Pure: no I/O, no DNS.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/result.hpp"

namespace pdgate {

// One host of a URL's authority.
struct UrlHost {
  // Percent-decoded; an IPv6 address without its brackets; empty when the
  // URL names none ("http://:8100", "unix:///path"). A name holds only
  // letters, digits, '-', '.' and '_'.
  std::string host;
  bool ipv6 = false;
  std::optional<std::uint16_t> port;  // none when not given, or given empty ("h:")
};

struct Url {
  std::string scheme;  // lower case; empty for a bare authority ("host:port")
  bool has_userinfo = false;
  std::string user;                     // percent-decoded
  std::optional<std::string> password;  // percent-decoded; none without ':' in the user info
  std::vector<UrlHost> hosts;           // one; more only with HostList::many
  std::string path;                     // as written (percent-encoded)
  std::optional<std::string> query;     // as written, without the '?'
  std::optional<std::string> fragment;  // as written, without the '#'
};

enum class HostList { one, many };

// Parses `text`. Without a "scheme://" prefix it is read as an authority
// alone: "host:port", "[::1]:8000", ":8100". With HostList::many the
// authority may list several hosts, separated by commas
// ("redis+sentinel://:pw@s1:26379,s2/master"). Ports are 1-65535. The
// message of a failure names the part at fault (host, port, path, ...)
// and never repeats the user info, which may hold a password.
Result<Url> parse_url(std::string_view text, HostList hosts = HostList::one);

// "host:port", with brackets around an IPv6 address.
std::string host_port(std::string_view host, std::uint16_t port);

// A port number: 1-65535, or 0-65535 when `allow_zero`.
Result<std::uint16_t> parse_port(std::string_view text, bool allow_zero);

// The key=value items of a URL query, values percent-decoded ('+' stays
// '+', as Redis clients write passwords).
Result<std::vector<std::pair<std::string, std::string>>> query_items(std::string_view query);

// A percent-encoded URL part (a path), decoded.
Result<std::string> percent_decoded(std::string_view text);

// `text` for logs and GET /admin/config: the password of its user info
// (or the user info itself when it has no ':', which Redis URLs read as a
// password) and every query item named `password` or `*_password` are
// "***". Text that is not a URL shows as "(invalid URL)".
std::string url_without_secrets(std::string_view text);

}  // namespace pdgate
