// The configuration in force as GET /admin/config shows it, and what a
// reload changes: each option's value in its flag's syntax (secrets
// masked), the diff between two configs, and the part of a new config a
// reload applies without a restart.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/url.hpp"
#include "core/config/config.hpp"
#include "core/config/detail/option_table.hpp"

namespace pdgate::config_detail {
namespace {

// The effective value of one option, as its entry's binding prints it.
std::vector<std::string> option_value(const Config& c, const Option& o) {
  // Every option a file may set has a printer (config_test checks it).
  return o.binding.show == nullptr ? std::vector<std::string>{"(not shown)"} : o.binding.show(c);
}

// Other spellings of an instance list: a reload reports the list's own key.
bool spells_another_key(std::string_view key) {
  return key.starts_with("prefiller-") || key.starts_with("decoder-") ||
         key == "decode-servers-urls" || key == "prefill-servers-urls";
}

}  // namespace
}  // namespace pdgate::config_detail

namespace pdgate {

std::string mask_url_password(const std::string& url) {
  return url_without_secrets(url);
}

std::vector<ConfigEntry> effective_config(const Config& c) {
  std::vector<ConfigEntry> out;
  for (const auto& o : config_detail::options()) {
    if (o.cli_only)
      continue;
    out.push_back({std::string(o.key), config_detail::option_value(c, o), o.list, o.restart});
  }
  return out;
}

ConfigDiff diff_config(const Config& before, const Config& after) {
  ConfigDiff d;
  // What is applied is what reloadable_part() takes from `after` (with
  // prefill off, a prefill list stays as it was).
  const Config applied = reloadable_part(before, after);
  for (const auto& o : config_detail::options()) {
    if (o.cli_only || config_detail::spells_another_key(o.key))
      continue;
    const Config& now = o.restart ? after : applied;
    if (config_detail::option_value(before, o) == config_detail::option_value(now, o))
      continue;
    (o.restart ? d.restart_needed : d.applied).emplace_back(o.key);
  }
  // DNS sources are resolved by a discovery started once.
  const auto dns_texts = [](const Config& c) {
    std::vector<std::string> t;
    for (const auto& d : c.dns_sources)
      t.push_back(std::string(to_string(d.role)) + " " + d.text());
    return t;
  };
  if (dns_texts(before) != dns_texts(after))
    d.restart_needed.emplace_back("dns:// instance sources");
  // Whether prefill runs at all shapes each worker's pipeline.
  if (before.prefill_disabled != after.prefill_disabled)
    d.restart_needed.emplace_back("prefill-servers-urls (disable)");
  return d;
}

Config reloadable_part(const Config& running, Config c) {
  // Prefill switched on or off waits for a restart, and so does the
  // prefill list meanwhile: an empty one cannot serve, and one given
  // while prefill is off has no stage to serve.
  if (running.prefill_disabled || c.prefill_disabled != running.prefill_disabled)
    c.prefill = running.prefill;
  // Every restart-only option keeps its running value, copied by its
  // entry's binding.
  for (const auto& o : config_detail::options()) {
    if (o.restart)
      o.binding.keep(c, running);
  }
  // What no option's binding copies: whether prefill runs at all (it shapes
  // each worker's pipeline), the --config path, and the DNS sources,
  // resolved by a discovery started once.
  c.prefill_disabled = running.prefill_disabled;
  c.config_file = running.config_file;
  c.dns_sources = running.dns_sources;
  return c;
}

}  // namespace pdgate
