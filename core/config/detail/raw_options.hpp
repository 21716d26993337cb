// Option values as read, before they are a Config: what the YAML loader and
// the command-line parser collect, merge and hand to apply_raw(), and the
// errors they gather on the way. Internal to core/config/.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/base/result.hpp"
#include "core/config/config.hpp"

namespace pdgate::config_detail {

// Labels and weight given with one instance in a YAML list.
struct InstanceMeta {
  std::map<std::string, std::string> labels;
  unsigned weight = 1;
  KvEventsEndpoint kv_events;
  std::uint32_t dp_size = 1;  // data_parallel_size
};

// The values given for one option, and where they came from (the flag as
// the user spelled it, or the config key) so errors point at the culprit.
// `meta`, when not empty, holds one entry per value (YAML instance lists).
struct RawValue {
  std::string origin;
  std::vector<std::string> values;
  std::vector<InstanceMeta> meta;
};
using RawMap = std::map<std::string, RawValue, std::less<>>;
// Mistakes found so far: parsing goes on after one, so that every mistake
// is reported at once.
using Errors = std::vector<std::string>;

// Every message, a line each.
Failure fail_all(const Errors& errors);

// Builds a Config from collected option values on top of `c`, adding a
// message to `errors` for each bad value (which leaves its option as it
// was). Used for the YAML file, the command line and both merged, so all
// share the rules.
Config apply_raw(Config c, const RawMap& raw, Errors& errors);

// Reads a YAML document into option values. `label` names the source in
// errors ("config file 'x.yaml'"). A bad key is reported and skipped.
RawMap yaml_to_raw(const std::string& yaml_text, const std::string& label, Errors& errors);

}  // namespace pdgate::config_detail
