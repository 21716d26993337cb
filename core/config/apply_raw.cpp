// Option values as read (from the YAML file, the command line, or both
// merged) made into a Config: the engine lists from their three forms, each
// single-valued option through its entry's setter, and the list options.
// The same rules serve every source.
#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/text.hpp"
#include "core/base/url.hpp"
#include "core/config/config.hpp"
#include "core/config/detail/option_table.hpp"
#include "core/config/detail/raw_options.hpp"
#include "core/config/detail/values.hpp"

namespace pdgate::config_detail {
namespace {

// The EPD proxy's list syntax: comma-separated, whitespace trimmed, empty
// items dropped.
std::vector<std::string> split_urls(std::string_view text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos)
      comma = text.size();
    const std::string_view item = trim(text.substr(pos, comma - pos));
    if (!item.empty())
      out.emplace_back(item);
    pos = comma + 1;
  }
  return out;
}

// An EPD option's items split at commas; an item that carries labels or a
// weight must be a single URL, which keeps them.
RawValue split_epd(const RawValue& v) {
  RawValue split{v.origin, {}, {}};
  for (std::size_t k = 0; k < v.values.size(); ++k) {
    for (auto& u : split_urls(v.values[k])) {
      split.values.push_back(std::move(u));
      if (!v.meta.empty())
        split.meta.push_back(v.meta[k]);
    }
  }
  return split;
}

}  // namespace

Config apply_raw(Config c, const RawMap& raw, Errors& errors) {
  const auto get = [&](std::string_view key) -> const RawValue* {
    const auto it = raw.find(key);
    return it == raw.end() ? nullptr : &it->second;
  };
  const auto err = [&](const RawValue& v, const std::string& what) {
    errors.push_back(v.origin + ": " + what);
  };

  // Engines: every form contributes to the same lists, in the order demo,
  // multi-turn, EPD. A role's list is replaced only when some form names it.
  // dns:// entries, by role; a role named anywhere replaces its sources.
  std::vector<DnsSource> dns[4];
  const auto parse_list = [&](const RawValue& v, Role role, std::vector<UpstreamSpec>& out) {
    for (std::size_t k = 0; k < v.values.size(); ++k) {
      const std::string& text = v.values[k];
      if (lower(trim(text).substr(0, 6)) == "dns://") {
        if (auto d = parse_dns_source(role, trim(text)))
          dns[static_cast<int>(role)].push_back(std::move(*d));
        else
          err(v, d.error());
        continue;
      }
      auto u = parse_upstream(role, text);
      if (!u) {
        err(v, u.error());
        continue;
      }
      if (k < v.meta.size()) {
        if (auto why = label_problem(v.meta[k].labels)) {
          err(v, u->url + ": labels: " + *why);
          continue;
        }
        u->labels = v.meta[k].labels;
        u->weight = v.meta[k].weight;
        u->kv_events = v.meta[k].kv_events;
        u->dp_size = v.meta[k].dp_size;
      }
      out.push_back(std::move(*u));
    }
  };
  std::vector<UpstreamSpec> prefill, decode, encode;
  bool prefill_named = false, decode_named = false, encode_named = false;
  if (const auto* v = get("prefill")) {
    parse_list(*v, Role::prefill, prefill);
    prefill_named = true;
  }
  if (const auto* v = get("decode")) {
    parse_list(*v, Role::decode, decode);
    decode_named = true;
  }

  // EPD form, parsed before the multi-turn defaults so that those apply
  // only when no other form gave the role's instances.
  std::vector<UpstreamSpec> epd_prefill, epd_decode;
  if (const auto* v = get("encode-servers-urls")) {
    parse_list(split_epd(*v), Role::encode, encode);
    encode_named = true;
  }
  if (const auto* v = get("decode-servers-urls")) {
    parse_list(split_epd(*v), Role::decode, epd_decode);
    decode_named = true;
  }
  if (const auto* v = get("prefill-servers-urls")) {
    const RawValue split = split_epd(*v);
    // Like the EPD proxy, "disable", "none" or nothing at all means E+PD:
    // no prefill stage, one hop to a combined instance.
    const std::string word = v->values.size() == 1 ? lower(trim(v->values.front())) : "";
    if (word == "disable" || word == "none" || split.values.empty()) {
      c.prefill_disabled = true;
    } else {
      c.prefill_disabled = false;
      parse_list(split, Role::prefill, epd_prefill);
      prefill_named = true;
    }
  }

  // Multi-turn form: hosts and ports given separately, zipped pairwise, with
  // the Python proxy's defaults for whichever side was left out.
  const auto* ph = get("prefiller-host");
  const auto* pp = get("prefiller-port");
  const auto* dh = get("decoder-host");
  const auto* dp = get("decoder-port");
  std::vector<UpstreamSpec> mt_prefill, mt_decode;
  if (ph != nullptr || pp != nullptr || dh != nullptr || dp != nullptr) {
    const auto zip = [&](const RawValue* hosts, const RawValue* ports, std::string_view def_port,
                         Role role, std::string_view side, std::vector<UpstreamSpec>& out) {
      const std::vector<std::string> def_hosts{"localhost"};
      const std::vector<std::string> def_ports{std::string(def_port)};
      const auto& hv = hosts != nullptr ? hosts->values : def_hosts;
      const auto& pv = ports != nullptr ? ports->values : def_ports;
      if (hv.size() != pv.size()) {
        errors.push_back("Number of " + std::string(side) + " hosts must match ports (" +
                         std::to_string(hv.size()) + " hosts, " + std::to_string(pv.size()) +
                         " ports)");
        return;
      }
      // Errors name the flag that supplied the bad item; defaults are valid.
      const RawValue defaults{"--" + std::string(side) + "-host", {}, {}};
      const RawValue& host_origin = hosts != nullptr ? *hosts : defaults;
      const RawValue& port_origin = ports != nullptr ? *ports : defaults;
      for (std::size_t i = 0; i < hv.size(); ++i) {
        const std::string_view host = trim(hv[i]);
        if (host.empty()) {
          err(host_origin, "empty host");
          continue;
        }
        auto port = parse_port(trim(pv[i]), false);
        if (!port) {
          err(port_origin, port.error());
          continue;
        }
        // "::1" and "[::1]" both name an IPv6 host.
        const std::string_view bare =
            host.starts_with('[') && host.ends_with(']') ? host.substr(1, host.size() - 2) : host;
        auto u = parse_upstream(role, host_port(bare, *port));
        if (!u) {
          err(host_origin, u.error());
          continue;
        }
        out.push_back(std::move(*u));
      }
    };
    if (ph != nullptr || pp != nullptr ||
        (prefill.empty() && epd_prefill.empty() && !c.prefill_disabled)) {
      zip(ph, pp, "8100", Role::prefill, "prefiller", mt_prefill);
      prefill_named = true;
    }
    if (dh != nullptr || dp != nullptr || (decode.empty() && epd_decode.empty())) {
      zip(dh, dp, "8200", Role::decode, "decoder", mt_decode);
      decode_named = true;
    }
  }

  if (prefill_named) {
    prefill.insert(prefill.end(), mt_prefill.begin(), mt_prefill.end());
    prefill.insert(prefill.end(), epd_prefill.begin(), epd_prefill.end());
    c.prefill = std::move(prefill);
  }
  if (decode_named) {
    decode.insert(decode.end(), mt_decode.begin(), mt_decode.end());
    decode.insert(decode.end(), epd_decode.begin(), epd_decode.end());
    c.decode = std::move(decode);
  }
  if (encode_named)
    c.encode = std::move(encode);
  for (Role role : {Role::prefill, Role::decode, Role::encode}) {
    const bool named = role == Role::prefill  ? prefill_named
                       : role == Role::decode ? decode_named
                                              : encode_named;
    if (!named)
      continue;
    std::erase_if(c.dns_sources, [&](const DnsSource& d) { return d.role == role; });
    for (auto& d : dns[static_cast<int>(role)])
      c.dns_sources.push_back(std::move(d));
  }

  // Every single-valued option, through its entry's setter.
  for (const auto& o : options()) {
    if (o.binding.apply == nullptr)
      continue;
    if (const auto* v = get(o.key)) {
      if (v->values.size() != 1) {
        err(*v, "expects exactly one value");
        continue;
      }
      if (auto r = o.binding.apply(c, v->values.front()); !r)
        err(*v, r.error());
    }
  }
  if (const auto* v = get("forward-headers")) {
    c.forward_headers.clear();
    for (const auto& item : v->values) {
      for (auto& h : split_urls(item)) {
        auto name = extra_header_name(h);
        if (!name) {
          err(*v, name.error());
          continue;
        }
        if (std::find(c.forward_headers.begin(), c.forward_headers.end(), *name) ==
            c.forward_headers.end())
          c.forward_headers.push_back(std::move(*name));
      }
    }
  }
  if (const auto* v = get("policy-log-level")) {
    c.policy_log_levels.clear();
    for (const auto& item : v->values) {
      auto l = parse_policy_log_level(item);
      if (!l) {
        err(*v, l.error());
        continue;
      }
      std::erase_if(c.policy_log_levels, [&](const auto& e) { return e.first == l->first; });
      c.policy_log_levels.push_back(std::move(*l));
    }
  }
  if (const auto* v = get("set-header")) {
    c.set_headers.clear();
    for (const auto& item : v->values) {
      auto h = parse_set_header(item);
      if (!h) {
        err(*v, h.error());
        continue;
      }
      c.set_headers.push_back(std::move(*h));
    }
  }
  if (const auto* v = get("allowed-upstreams")) {
    c.allowed_upstreams.clear();
    for (const auto& item : v->values) {
      for (auto& u : split_urls(item))
        c.allowed_upstreams.push_back(std::move(u));
    }
  }
  // After the instance lists: each names an instance given in one of them,
  // and `set` is applied to it in every list of `lists` that has it.
  const auto attach = [](std::initializer_list<std::vector<UpstreamSpec>*> lists,
                         const std::string& url, const auto& set) {
    bool found = false;
    for (auto* list : lists) {
      for (auto& u : *list) {
        if (u.url == url) {
          set(u);
          found = true;
        }
      }
    }
    return found;
  };
  if (const auto* v = get("kv-events")) {
    for (const auto& item : v->values) {
      auto ev = parse_kv_events_flag(item);
      if (!ev) {
        err(*v, ev.error());
        continue;
      }
      if (!attach({&c.prefill, &c.decode, &c.encode}, ev->first,
                  [&](UpstreamSpec& u) { u.kv_events = ev->second; }))
        err(*v,
            "no instance " + ev->first + " is configured (give it with --prefill, --decode, ...)");
    }
  }
  if (const auto* v = get("data-parallel")) {
    for (const auto& item : v->values) {
      auto dp = parse_data_parallel_flag(item);
      if (!dp) {
        err(*v, dp.error());
        continue;
      }
      if (!attach({&c.prefill, &c.decode}, dp->first,
                  [&](UpstreamSpec& u) { u.dp_size = dp->second; }))
        err(*v, "no prefill or decode instance " + dp->first +
                    " is configured (give it with --prefill, --decode, ...)");
    }
  }
  return c;
}

Failure fail_all(const Errors& errors) {
  std::string out;
  for (const auto& e : errors)
    out += (out.empty() ? "" : "\n") + e;
  return fail(out);
}

}  // namespace pdgate::config_detail
