#include "core/base/url.hpp"

#include <boost/url/encode.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/parse_query.hpp>
#include <boost/url/pct_string_view.hpp>
#include <boost/url/rfc/unreserved_chars.hpp>
#include <boost/url/url_view.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "core/base/text.hpp"

namespace pdgate {

namespace {

namespace urls = boost::urls;

constexpr std::string_view kUserInfo = "the user info";

bool is_scheme(std::string_view s) {
  return !s.empty() && std::isalpha(static_cast<unsigned char>(s.front())) != 0 &&
         std::all_of(s.begin(), s.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '+' || c == '-' ||
                  c == '.';
         });
}

bool is_host_name(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '.' || c == '_';
  });
}

// " 'text'" for a message, or nothing when the URL may hold a password
// (it has an '@'), so that a misplaced character never shows part of it.
std::string quoted(std::string_view text, bool quiet) {
  return quiet ? std::string() : " '" + std::string(text) + "'";
}

Result<std::uint16_t> port_number(std::string_view text, bool allow_zero, bool quiet) {
  std::uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  const std::uint64_t min = allow_zero ? 0 : 1;
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < min ||
      v > 65535) {
    return fail("invalid port" + quoted(text, quiet) + " (expected " + std::to_string(min) +
                "-65535)");
  }
  return static_cast<std::uint16_t>(v);
}

// Where the parts of a URL written with "//" start, found by its
// delimiters alone: for messages about text Boost.URL refused, and to take
// a list of hosts apart.
struct Spans {
  std::size_t authority = 0;  // just after "//"
  std::size_t hosts = 0;      // after the user info's '@', if any
  std::size_t end = 0;        // the authority's end: '/', '?', '#' or the end
};

Spans spans_of(std::string_view n) {
  Spans s;
  s.authority = n.find("//") + 2;
  s.end = std::min(n.find_first_of("/?#", s.authority), n.size());
  const auto at = n.substr(s.authority, s.end - s.authority).rfind('@');
  s.hosts = at == std::string_view::npos ? s.authority : s.authority + at + 1;
  return s;
}

std::string_view part_at(std::string_view n, const Spans& s, std::size_t pos) {
  if (pos < s.authority)
    return "the scheme";
  if (pos < s.hosts)
    return kUserInfo;
  if (pos < s.end) {
    const std::string_view hosts = n.substr(s.hosts, s.end - s.hosts);
    const auto close = hosts.find(']');
    const auto colon = hosts.find(':', close == std::string_view::npos ? 0 : close);
    return colon != std::string_view::npos && pos > s.hosts + colon ? "the port" : "the host";
  }
  const auto query = n.find('?', s.end);
  const auto fragment = n.find('#', s.end);
  if (fragment != std::string_view::npos && pos > fragment)
    return "the fragment";
  if (query != std::string_view::npos && pos > query)
    return "the query";
  return "the path";
}

bool is_uri_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
         std::string_view("-._~:/?#[]@!$&'()*+,;=%").find(c) != std::string_view::npos;
}

// Why Boost.URL refused `n`, in words: its own errors ("leftover",
// "mismatch") do not say where.
std::string diagnose(std::string_view n, bool quiet) {
  const Spans s = spans_of(n);
  for (std::size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const auto u = static_cast<unsigned char>(c);
    std::string what;
    if (c == ' ')
      what = "a space";
    else if (u < 0x20 || u == 0x7f)
      what = "a control character";
    else if (u >= 0x80)
      what = "a non-ASCII character (percent-encode it)";
    else if (c == '%' &&
             !(i + 2 < n.size() && std::isxdigit(static_cast<unsigned char>(n[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(n[i + 2]))))
      what = "a bad percent-escape";
    else if (!is_uri_char(c))
      what = "the character" + quoted(std::string(1, c), quiet || part_at(n, s, i) == kUserInfo);
    if (!what.empty())
      return what + " in " + std::string(part_at(n, s, i));
  }
  // Every character is one URLs allow: the brackets are wrong.
  const std::string_view hosts = n.substr(s.hosts, s.end - s.hosts);
  if (hosts.starts_with('[')) {
    const auto close = hosts.find(']');
    if (close == std::string_view::npos)
      return "missing ']' after the IPv6 address";
    return "invalid IPv6 address" + quoted(hosts.substr(1, close - 1), quiet);
  }
  if (hosts.find(':') != hosts.rfind(':'))
    return "IPv6 addresses must be in brackets, e.g. [::1]:8100";
  return "not a valid URL";
}

// `n` is "scheme://..." or, for a bare authority, "//...".
Result<Url> parse_one(const std::string& n, bool has_scheme, bool quiet) {
  const auto r = has_scheme ? urls::parse_uri(n) : urls::parse_relative_ref(n);
  if (!r)
    return fail(diagnose(n, quiet));
  const urls::url_view& v = *r;
  const std::string_view path = v.encoded_path();
  // Boost.URL (1.81) lets a path without its '/' follow the authority:
  // "h:8x" reads as port 8 and path "x", "u:p@ss@h" as user info "u:p",
  // host "ss" and path "@h". The authority really ends at the '/'.
  if (!path.empty() && path.front() != '/') {
    const std::string_view tail = path.substr(0, path.find('/'));
    if (tail.find('@') != std::string_view::npos)
      return fail("an '@' in the user info must be written %40");
    const std::string port = std::string(v.port()) + std::string(tail);
    if (port.find(':') != std::string::npos)
      return fail("IPv6 addresses must be in brackets, e.g. [::1]:8100");
    if (v.host_type() == urls::host_type::ipv6 && !v.has_port())
      return fail("expected ':' and a port after ']'");
    return fail(port_number(port, false, quiet).error());
  }

  Url u;
  u.scheme = lower(v.scheme());
  u.has_userinfo = v.has_userinfo();
  u.user = v.user();
  if (v.has_password())
    u.password = v.password();
  UrlHost h;
  switch (v.host_type()) {
    case urls::host_type::ipv6:
      h.host = v.host_address();
      h.ipv6 = true;
      break;
    case urls::host_type::ipvfuture:
      return fail("unsupported address" + quoted(v.encoded_host(), quiet));
    default:
      h.host = v.host_address();
      if (!is_host_name(h.host))
        return fail("invalid host name" + quoted(v.encoded_host(), quiet));
  }
  if (v.has_port() && !v.port().empty()) {
    auto p = port_number(v.port(), false, quiet);
    if (!p)
      return fail(p.error());
    h.port = *p;
  }
  u.hosts.push_back(std::move(h));
  u.path = path;
  if (v.has_query())
    u.query = v.encoded_query();
  if (v.has_fragment())
    u.fragment = v.encoded_fragment();
  return u;
}

}  // namespace

Result<Url> parse_url(std::string_view text, HostList list) {
  const auto sep = text.find("://");
  const bool has_scheme = sep != std::string_view::npos && is_scheme(text.substr(0, sep));
  const bool quiet = text.find('@') != std::string_view::npos;
  const std::string n = has_scheme ? std::string(text) : "//" + std::string(text);
  if (list == HostList::one)
    return parse_one(n, has_scheme, quiet);

  // Boost.URL reads one host: the URL is read with the first host of the
  // list, then every other host alone.
  const Spans s = spans_of(n);
  const std::string_view all = std::string_view(n).substr(s.hosts, s.end - s.hosts);
  auto comma = all.find(',');
  if (comma == std::string_view::npos)
    return parse_one(n, has_scheme, quiet);
  auto u = parse_one(n.substr(0, s.hosts) + std::string(all.substr(0, comma)) + n.substr(s.end),
                     has_scheme, quiet);
  if (!u)
    return fail("host 1: " + u.error());
  std::string_view rest = all.substr(comma + 1);
  for (std::size_t k = 2;; ++k) {
    comma = rest.find(',');
    auto one = parse_one("//" + std::string(rest.substr(0, comma)), false, quiet);
    if (!one)
      return fail("host " + std::to_string(k) + ": " + one.error());
    u->hosts.push_back(std::move(one->hosts.front()));
    if (comma == std::string_view::npos)
      break;
    rest = rest.substr(comma + 1);
  }
  return u;
}

std::string host_port(std::string_view host, std::uint16_t port) {
  const std::string h(host);
  return (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + std::to_string(port);
}

Result<std::uint16_t> parse_port(std::string_view text, bool allow_zero) {
  return port_number(text, allow_zero, false);
}

Result<std::vector<std::pair<std::string, std::string>>> query_items(std::string_view query) {
  std::vector<std::pair<std::string, std::string>> out;
  if (query.empty())
    return out;
  // Boost.URL 1.81's parse_query calls strlen on what it is given
  // (ASan saw it read past a slice of a request target, which has no NUL
  // where the slice ends): it parses a NUL-terminated copy.
  const std::string text(query);
  const auto params = urls::parse_query(text);
  if (!params)
    return fail("bad percent-escape in the query");
  for (const auto& p : *params) {
    if (!p.has_value || p.key.empty())
      return fail("query items are key=value");
    out.emplace_back(p.key.decode(), p.value.decode());
  }
  return out;
}

Result<std::string> percent_decoded(std::string_view text) {
  const auto pct = urls::make_pct_string_view(text);
  if (!pct)
    return fail("bad percent-escape");
  return pct->decode();
}

std::string url_without_secrets(std::string_view text) {
  const auto u = parse_url(text, HostList::many);
  if (!u)
    return "(invalid URL)";
  std::string out = u->scheme.empty() ? std::string() : u->scheme + "://";
  if (u->has_userinfo)
    out += u->password ? urls::encode(u->user, urls::unreserved_chars) + ":***@" : "***@";
  for (std::size_t i = 0; i < u->hosts.size(); ++i) {
    const UrlHost& h = u->hosts[i];
    out += i ? "," : "";
    if (h.port)
      out += host_port(h.host, *h.port);
    else
      out += h.ipv6 ? "[" + h.host + "]" : h.host;
  }
  out += u->path;
  if (u->query) {
    const auto params = urls::parse_query(*u->query);
    if (!params)
      return "(invalid URL)";
    std::string sep = "?";
    for (const auto& p : *params) {
      const std::string_view key = p.key;
      const bool secret = key == "password" || key.ends_with("_password");
      out += sep + std::string(key);
      if (p.has_value)
        out += "=" + (secret ? std::string("***") : std::string(p.value));
      sep = "&";
    }
  }
  if (u->fragment)
    out += "#" + *u->fragment;
  return out;
}

}  // namespace pdgate
