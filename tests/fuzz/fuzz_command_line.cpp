// The command-line parser must answer every argv with a value or an error,
// and an accepted config must pass validate() and hold normalized URLs.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/config/config.hpp"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant failed: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // NUL-separated arguments.
  std::vector<std::string> args{"pdgate"};
  std::string cur;
  for (std::size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  args.push_back(cur);
  for (const auto& a : args) {
    // --config would read arbitrary files (/dev/zero never ends).
    if (a.find("config") != std::string::npos)
      return 0;
  }
  std::vector<const char*> argv;
  for (const auto& a : args)
    argv.push_back(a.c_str());
  const auto r = pdgate::parse_command_line(static_cast<int>(argv.size()), argv.data());
  if (!r.ok()) {
    check(!r.error().empty(), "empty error message");
    return 0;
  }
  if (r->help || r->version)  // both exit before any validation
    return 0;
  check(pdgate::validate(r->config).ok(), "accepted config fails validate");
  for (const auto* list : {&r->config.prefill, &r->config.decode, &r->config.encode}) {
    for (const auto& u : *list) {
      const auto again = pdgate::parse_upstream(u.role, u.url);
      check(again.ok() && again->url == u.url, "normalized URL does not reparse to itself");
    }
  }
  // What GET /admin/config shows and a reload compares: one value per
  // single-valued option, and no change between a config and itself.
  for (const auto& e : pdgate::effective_config(r->config))
    check(e.list || e.values.size() == 1, "single-valued option without exactly one value");
  const auto same = pdgate::diff_config(r->config, r->config);
  check(same.applied.empty() && same.restart_needed.empty(), "a config differs from itself");
  return 0;
}
