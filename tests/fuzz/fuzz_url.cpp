// The URL reader must answer every text with a URL or a message, and what
// it shows of a URL (passwords masked) must read back as the same URL.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/base/url.hpp"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant failed: %s\n", what);
    std::abort();
  }
}

void check_url(std::string_view text, pdgate::HostList list) {
  const auto u = pdgate::parse_url(text, list);
  if (!u) {
    check(!u.error().empty(), "empty error message");
    return;
  }
  check(!u->hosts.empty(), "a URL without a host entry");
  check(list == pdgate::HostList::many || u->hosts.size() == 1, "several hosts read from one");
  for (const auto& h : u->hosts) {
    if (h.host.empty() || !h.port)
      continue;
    const auto again = pdgate::parse_url(pdgate::host_port(h.host, *h.port));
    check(again && again->hosts.front().host == h.host && again->hosts.front().port == h.port,
          "host_port() does not read back");
  }
  if (u->query)
    (void)pdgate::query_items(*u->query);
  (void)pdgate::percent_decoded(u->path);

  const std::string shown = pdgate::url_without_secrets(text);
  const auto back = pdgate::parse_url(shown, pdgate::HostList::many);
  check(back.ok(), "the masked URL does not parse");
  check(back->scheme == u->scheme && back->path == u->path, "masking changed scheme or path");
  check(back->hosts.size() == u->hosts.size(), "masking changed the hosts");
  for (std::size_t i = 0; i < u->hosts.size(); ++i) {
    check(back->hosts[i].host == u->hosts[i].host && back->hosts[i].port == u->hosts[i].port,
          "masking changed a host");
  }
  if (u->password)
    check(back->password == "***" && back->user == u->user, "a password shows");
  else if (u->has_userinfo)
    check(back->user == "***" && !back->password, "a lone user info shows");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_url(text, pdgate::HostList::one);
  check_url(text, pdgate::HostList::many);
  return 0;
}
