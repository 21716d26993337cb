#include "core/upstream/instance_address.hpp"

#include <algorithm>
#include <map>

#include "core/upstream/upstream.hpp"

namespace pdgate {

namespace {

using Addresses = std::vector<net::ip::address>;

net::ip::address canonical(const net::ip::address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped())
    return net::ip::make_address_v4(net::ip::v4_mapped, a.to_v6());
  return a;
}

bool intersect(const Addresses& a, const Addresses& b) {
  return std::any_of(a.begin(), a.end(), [&](const net::ip::address& x) {
    return std::find(b.begin(), b.end(), x) != b.end();
  });
}

// Dotted digits: an IPv4 literal (parse_upstream admitted it). Two of
// them are the same address exactly when they are the same text, which
// the registry's URL index has already compared: no need to look again.
bool ipv4_text(const std::string& host) {
  return !host.empty() && std::all_of(host.begin(), host.end(),
                                      [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
}

// Resolves each distinct host name once per call: a list of many ports on
// a few hosts costs a few lookups.
class HostCache {
 public:
  HostCache(net::any_io_executor ex, std::chrono::steady_clock::time_point deadline)
      : ex_(std::move(ex)), deadline_(deadline) {}
  net::awaitable<const Addresses*> get(const std::string& host, std::uint16_t port) {
    const std::string key = lower(host);
    auto it = cache_.find(key);
    if (it == cache_.end())
      it = cache_.emplace(key, co_await resolve_host(ex_, host, port, deadline_)).first;
    co_return &it->second;
  }

 private:
  static std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
  }
  net::any_io_executor ex_;
  std::chrono::steady_clock::time_point deadline_;
  std::map<std::string, Addresses> cache_;
};

}  // namespace

net::awaitable<Addresses> resolve_host(net::any_io_executor ex, const std::string& host,
                                       std::uint16_t port,
                                       std::chrono::steady_clock::time_point deadline) {
  Addresses out;
  beast::error_code not_literal;
  if (auto literal = net::ip::make_address(host, not_literal); !not_literal) {
    out.push_back(canonical(literal));
    co_return out;
  }
  if (std::chrono::steady_clock::now() >= deadline)
    co_return out;
  auto [ec, results] = co_await resolve_until(ex, host, port, deadline);
  if (ec)
    co_return out;
  for (const auto& r : results) {
    const auto a = canonical(r.endpoint().address());
    if (std::find(out.begin(), out.end(), a) == out.end())
      out.push_back(a);
  }
  co_return out;
}

net::awaitable<std::vector<std::string>> resolved_duplicates(
    net::any_io_executor ex, const Config& cfg, std::chrono::steady_clock::time_point deadline) {
  std::vector<std::string> out;
  HostCache hosts(ex, deadline);
  for (const auto* list : {&cfg.prefill, &cfg.decode, &cfg.encode}) {
    for (std::size_t i = 0; i < list->size(); ++i) {
      const auto& a = (*list)[i];
      const Addresses* ra = co_await hosts.get(a.host, a.port);
      for (std::size_t j = 0; j < i; ++j) {
        const auto& b = (*list)[j];
        if (a.port != b.port)
          continue;
        const Addresses* rb = co_await hosts.get(b.host, b.port);
        if (intersect(*ra, *rb)) {
          out.push_back(std::string(to_string(a.role)) + " instance " + a.url + " is " + b.url +
                        " again: both resolve to " + (*ra).front().to_string() + ":" +
                        std::to_string(a.port) + "; list it once");
          break;
        }
      }
    }
  }
  co_return out;
}

net::awaitable<InstancePtr> same_address_instance(net::any_io_executor ex, const InstanceSet& set,
                                                  const UpstreamSpec& spec,
                                                  std::chrono::steady_clock::time_point deadline) {
  HostCache hosts(ex, deadline);
  const Addresses* mine = co_await hosts.get(spec.host, spec.port);
  if (mine->empty())
    co_return nullptr;
  const bool mine_v4 = ipv4_text(spec.host);
  // An address literal can only be another spelling of an instance named
  // by a host name (the same literal is the same URL, refused before):
  // only those are scanned, so thousands of instances given by address
  // cost nothing here (a scan of all of them made each admin add O(n)).
  // Cheap tests first: no instance is resolved unless its port and role
  // match.
  for (const auto& inst : mine_v4 ? set.named : set.by_id) {
    if (inst->spec.port != spec.port || !roles_overlap(inst->spec.role, spec.role))
      continue;
    if (mine_v4 && ipv4_text(inst->spec.host))
      continue;
    const Addresses* theirs = co_await hosts.get(inst->spec.host, inst->spec.port);
    if (intersect(*mine, *theirs))
      co_return inst;
  }
  co_return nullptr;
}

}  // namespace pdgate
