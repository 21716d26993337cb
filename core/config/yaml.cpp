// The --config file: a YAML mapping of option names to values, read into
// raw option values (instance lists may carry labels, a weight and KV-event
// endpoints per instance), then applied as the command line's are.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/base/text.hpp"
#include "core/config/config.hpp"
#include "core/config/detail/option_table.hpp"
#include "core/config/detail/raw_options.hpp"
#include "core/config/detail/values.hpp"

namespace pdgate::config_detail {
namespace {

// An instance's kv_events in YAML: {endpoint: URL, replay_endpoint: URL},
// or the endpoint alone as a string.
Result<KvEventsEndpoint> yaml_kv_events(const YAML::Node& value) {
  KvEventsEndpoint ev;
  if (value.IsScalar()) {
    ev.endpoint = value.Scalar();
  } else if (value.IsMap()) {
    for (const auto& f : value) {
      const std::string key = f.first.IsScalar() ? f.first.Scalar() : std::string();
      if (!f.second.IsScalar())
        return fail("'" + key + "' must be a plain string");
      if (key == "endpoint")
        ev.endpoint = f.second.Scalar();
      else if (key == "replay_endpoint" || key == "replay-endpoint")
        ev.replay = f.second.Scalar();
      else
        return fail("unknown field '" + key + "' (expected endpoint, replay_endpoint)");
    }
  } else {
    return fail("expected {endpoint, replay_endpoint} or an endpoint");
  }
  return check_kv_events_endpoint(std::move(ev));
}

// Reads one instance given as a mapping: {url: ..., labels: {k: v},
// weight: N}. Returns the URL; adds to `errors` and returns nothing when
// the item is malformed.
std::optional<std::string> yaml_instance(const YAML::Node& item, const std::string& origin,
                                         InstanceMeta& meta, Errors& errors) {
  std::optional<std::string> url;
  bool ok = true;
  for (const auto& field : item) {
    const std::string name = field.first.IsScalar() ? field.first.Scalar() : std::string();
    const YAML::Node& value = field.second;
    if (name == "url") {
      if (!value.IsScalar()) {
        errors.push_back(origin + ": an instance's url must be a plain string");
        ok = false;
      } else {
        url = value.Scalar();
      }
    } else if (name == "labels") {
      if (!value.IsMap()) {
        errors.push_back(origin + ": an instance's labels must be a mapping of strings");
        ok = false;
        continue;
      }
      for (const auto& l : value) {
        if (!l.first.IsScalar() || !l.second.IsScalar()) {
          errors.push_back(origin + ": label names and values must be plain strings");
          ok = false;
          break;
        }
        meta.labels[l.first.Scalar()] = l.second.Scalar();
      }
    } else if (name == "weight") {
      auto w = value.IsScalar() ? parse_uint(trim(value.Scalar()), 1000)
                                : Result<std::uint64_t>(fail("not a number"));
      if (!w || *w == 0) {
        errors.push_back(origin + ": an instance's weight must be an integer from 1 to 1000");
        ok = false;
      } else {
        meta.weight = static_cast<unsigned>(*w);
      }
    } else if (name == "kv_events" || name == "kv-events") {
      auto ev = yaml_kv_events(value);
      if (!ev) {
        errors.push_back(origin + ": kv_events: " + ev.error());
        ok = false;
      } else {
        meta.kv_events = std::move(*ev);
      }
    } else if (name == "data_parallel_size" || name == "data-parallel-size") {
      auto n = value.IsScalar()
                   ? parse_uint(trim(value.Scalar()), UpstreamSpec::kMaxDataParallelSize)
                   : Result<std::uint64_t>(fail("not a number"));
      if (!n || *n == 0) {
        errors.push_back(origin +
                         ": an instance's data_parallel_size must be an integer from 1 to " +
                         std::to_string(UpstreamSpec::kMaxDataParallelSize));
        ok = false;
      } else {
        meta.dp_size = static_cast<std::uint32_t>(*n);
      }
    } else {
      errors.push_back(origin + ": unknown instance field '" + name +
                       "' (expected url, labels, weight, kv_events, data_parallel_size)");
      ok = false;
    }
  }
  if (!url) {
    if (ok)
      errors.push_back(origin + ": an instance given as a mapping needs a url");
    return std::nullopt;
  }
  if (!ok)
    return std::nullopt;
  return url;
}

bool takes_instances(const Option& o) {
  return o.key == "prefill" || o.key == "decode" || o.key.ends_with("-servers-urls");
}

}  // namespace

RawMap yaml_to_raw(const std::string& yaml_text, const std::string& label, Errors& errors) {
  RawMap raw;
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsDefined() || root.IsNull())
      return raw;
    if (!root.IsMap()) {
      errors.push_back(label + ": expected a mapping of option names to values");
      return raw;
    }
    for (const auto& kv : root) {
      if (!kv.first.IsScalar()) {
        errors.push_back(label + ": option names must be plain strings");
        continue;
      }
      const std::string name = kv.first.Scalar();
      const Option* o = find_option(name);
      if (o == nullptr) {
        errors.push_back(label + ": unknown key '" + name + "' (see --help for the option names)");
        continue;
      }
      if (o->cli_only) {
        errors.push_back(label + ": '" + name + "' can only be given on the command line");
        continue;
      }
      RawValue v{label + ", key '" + name + "'", {}, {}};
      const YAML::Node& node = kv.second;
      if (node.IsNull())
        continue;  // `key:` with nothing after it leaves the default
      if (node.IsScalar()) {
        v.values.push_back(node.Scalar());
      } else if (node.IsSequence()) {
        bool bad = false;
        bool any_meta = false;
        std::vector<InstanceMeta> meta;
        for (const auto& item : node) {
          InstanceMeta m;
          if (item.IsMap() && takes_instances(*o)) {
            auto url = yaml_instance(item, v.origin, m, errors);
            if (!url) {
              bad = true;
              continue;
            }
            v.values.push_back(*url);
            any_meta = true;
          } else if (!item.IsScalar()) {
            errors.push_back(v.origin +
                             (takes_instances(*o)
                                  ? ": list items must be addresses or {url, labels, weight}"
                                  : ": list items must be plain values"));
            bad = true;
            continue;
          } else {
            v.values.push_back(item.Scalar());
          }
          meta.push_back(std::move(m));
        }
        // A bad item is reported and left out; the others still count,
        // so the rules that look at the whole list report what they find.
        if (bad && v.values.empty())
          continue;
        if (any_meta)
          v.meta = std::move(meta);
        // The EPD keys hold comma-separated text on the command line; a YAML
        // list of URLs is the natural spelling in a file, so join it (a
        // list with labels keeps its items apart: each is one URL).
        if (o->key.ends_with("-servers-urls")) {
          if (!any_meta) {
            std::string joined;
            for (const auto& item : v.values)
              joined += (joined.empty() ? "" : ",") + item;
            v.values = {joined};
          }
        } else if (!o->list) {
          errors.push_back(v.origin + ": expects a single value, not a list");
          continue;
        } else if (v.values.empty()) {
          errors.push_back(v.origin + ": the list must not be empty");
          continue;
        }
      } else {
        errors.push_back(v.origin + ": expects a value or a list, not a mapping");
        continue;
      }
      raw[std::string(o->key)] = std::move(v);
    }
  } catch (const YAML::Exception& e) {
    errors.push_back(label + ": " + e.what());
  }
  return raw;
}

}  // namespace pdgate::config_detail

namespace pdgate {

Result<Config> apply_yaml(Config base, const std::string& yaml_text) {
  config_detail::Errors errors;
  auto raw = config_detail::yaml_to_raw(yaml_text, "config", errors);
  auto c = config_detail::apply_raw(std::move(base), raw, errors);
  if (!errors.empty())
    return config_detail::fail_all(errors);
  return c;
}

}  // namespace pdgate
