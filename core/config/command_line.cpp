// The command line: the three drop-in forms of vLLM's proxies and every
// other flag, read into raw option values, merged over the --config file's
// and made into a validated Config.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "core/config/config.hpp"
#include "core/config/detail/option_table.hpp"
#include "core/config/detail/raw_options.hpp"

namespace pdgate::config_detail {
namespace {

bool looks_like_option(std::string_view tok) {
  if (tok.size() > 2 && tok.starts_with("--"))
    return true;
  return tok.size() >= 2 && tok[0] == '-' && std::isalpha(static_cast<unsigned char>(tok[1])) != 0;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return fail("--config: cannot read '" + path + "': " + std::generic_category().message(errno));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad())
    return fail("--config: error reading '" + path + "'");
  return ss.str();
}

}  // namespace
}  // namespace pdgate::config_detail

namespace pdgate {

CommandLine read_command_line(int argc, const char* const* argv, std::vector<std::string>& errors) {
  CommandLine cl;
  // Help wins over every other mistake, so `pdgate --typo --help` helps.
  for (int i = 1; i < argc; ++i) {
    const std::string_view tok = argv[i] == nullptr ? "" : argv[i];
    if (tok == "-h" || tok == "--help") {
      cl.help = true;
      return cl;
    }
  }

  config_detail::RawMap flags;
  std::string config_path;
  bool config_given = false;
  int i = 1;
  while (i < argc) {
    const std::string tok = argv[i] == nullptr ? "" : argv[i];
    ++i;
    const config_detail::Option* o = nullptr;
    std::optional<std::string> inline_value;
    std::string spelled;
    if (tok.size() > 2 && tok.starts_with("--")) {
      const std::size_t eq = tok.find('=');
      spelled = tok.substr(0, eq);
      if (eq != std::string::npos)
        inline_value = tok.substr(eq + 1);
      o = config_detail::find_option(std::string_view(spelled).substr(2));
    } else if (config_detail::looks_like_option(tok)) {
      spelled = tok.substr(0, 2);
      o = config_detail::find_short(tok[1]);
      if (tok.size() > 2)
        inline_value = tok.substr(tok[2] == '=' ? 3 : 2);
    } else {
      errors.push_back("unexpected argument '" + tok + "' (options start with --; see --help)");
      continue;
    }
    if (o == nullptr) {
      errors.push_back("unknown option '" + spelled + "' (see --help)");
      // Its values, if any, belong to it: skip them rather than report
      // each as an unexpected argument.
      while (i < argc && !config_detail::looks_like_option(argv[i] == nullptr ? "" : argv[i]))
        ++i;
      continue;
    }
    if (o->key == "help") {
      cl.help = true;
      return cl;
    }
    if (o->key == "version") {
      cl.version = true;
      return cl;
    }
    if (o->key == "check-config") {
      cl.check_only = true;
      continue;
    }

    config_detail::RawValue v{spelled, {}, {}};
    if (inline_value)
      v.values.push_back(*inline_value);
    // argparse's nargs="+": a list option takes every following token up
    // to the next option; a single-valued one takes exactly one.
    while (i < argc && (v.values.empty() || o->list)) {
      const std::string_view next = argv[i] == nullptr ? "" : argv[i];
      if (config_detail::looks_like_option(next))
        break;
      v.values.emplace_back(next);
      ++i;
    }
    if (v.values.empty()) {
      errors.push_back("missing value for " + spelled + " (expected " + std::string(o->metavar) +
                       (o->list ? " ..." : "") + ")");
      continue;
    }
    if (o->key == "config") {
      config_path = v.values.front();
      config_given = true;
      continue;
    }
    // Repeating an option replaces its earlier values, as with argparse,
    // but for the repeatable ones (--set-header A --set-header B).
    auto& slot = flags[std::string(o->key)];
    if (o->repeatable && !slot.values.empty()) {
      for (auto& value : v.values)
        slot.values.push_back(std::move(value));
    } else {
      slot = std::move(v);
    }
  }

  config_detail::RawMap merged;
  if (config_given) {
    auto text = config_detail::read_file(config_path);
    if (!text)
      errors.push_back(text.error());
    else
      merged = config_detail::yaml_to_raw(*text, "config file '" + config_path + "'", errors);
  }
  for (auto& [key, value] : flags)
    merged[key] = std::move(value);

  auto config = config_detail::apply_raw(Config{}, merged, errors);
  config.config_file = config_path;
  // Cross-field rules are checked even after a bad value, so one run
  // lists everything to fix; a rule broken only because a bad value was
  // left at its default is still worth knowing about.
  auto valid = validate(config);
  if (!valid) {
    std::string_view rest = valid.error();
    while (!rest.empty()) {
      const auto nl = std::min(rest.find('\n'), rest.size());
      errors.emplace_back(rest.substr(0, nl));
      rest.remove_prefix(std::min(nl + 1, rest.size()));
    }
    cl.config = std::move(config);
  } else {
    cl.config = std::move(*valid);
  }
  return cl;
}

Result<CommandLine> parse_command_line(int argc, const char* const* argv) {
  config_detail::Errors errors;
  CommandLine cl = read_command_line(argc, argv, errors);
  if (!errors.empty())
    return config_detail::fail_all(errors);
  return cl;
}

}  // namespace pdgate
