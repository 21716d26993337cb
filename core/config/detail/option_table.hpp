// The shape of the option table (options.cpp) and the lookups into it, for
// the files that read it: the YAML loader, the command-line parser, the
// raw-values-to-Config step and the effective config. Internal to
// core/config/.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/result.hpp"
#include "core/config/config.hpp"

namespace pdgate::config_detail {

// How an option's value moves between its text and the Config. Each entry
// of kOptions names its binding, so an option is added in one place: its
// entry (name, help, binding); apply_raw(), the effective config and a
// reload read the binding and never name the option. The engine lists
// (the demo, multi-turn and EPD forms) combine several options and are set
// together by apply_raw(), which also reads the other list-valued options
// without a setter.
using Apply = Result<bool> (*)(Config& c, std::string_view value);
// The option's value in the syntax its flag takes (secrets masked), one
// item per value: what GET /admin/config shows and a reload compares.
using Show = std::vector<std::string> (*)(const Config& c);
// Copies the option's value from `from` into `to`: a reload keeping the
// running value of a restart-only option.
using Keep = void (*)(Config& to, const Config& from);

struct Binding {
  Apply apply = nullptr;  // sets one value; nullptr: read by apply_raw (lists, engines)
  Show show = nullptr;    // nullptr only for the options a config file cannot set
  Keep keep = nullptr;    // every restart-only option has one (config_test checks)
};

// Every option, once: the command-line parser, the YAML loader, the help
// text, the effective config and a reload all read this table, so a flag
// cannot exist in one and not the others.
struct Option {
  std::string_view key;      // canonical name: the long flag without dashes
  std::string_view alias;    // a second long name (the Python proxies' plural forms)
  char short_name;           // 0 when there is none
  bool list;                 // takes one or more values (argparse nargs="+")
  bool cli_only;             // meaningless in a config file
  std::string_view group;    // help section
  std::string_view metavar;  // value placeholder in the help
  std::string_view help;     // one line, ends with the default when there is one
  Binding binding = {};      // how its value is set, shown and kept
  // Read once at start (a listener, a thread count, a connection pool's
  // shape): a reload names a change but leaves the running value.
  bool restart = false;
  bool repeatable = false;  // given again on the command line, adds values (no replacing)
};

// Every option, in --help order.
std::span<const Option> options();

// '_' and '-' are interchangeable in names, as in vLLM's own CLI, so
// `max_body_size` in YAML and `--max-body-size` mean the same thing.
const Option* find_option(std::string_view name);
// The option with this one-letter flag (-m, -p, ...), or nullptr.
const Option* find_short(char c);

}  // namespace pdgate::config_detail
