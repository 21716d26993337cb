#include <cstdio>
#include <string>
#include <vector>

#include "sim/options.hpp"
#include "sim/server.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  pdgate::sim::ParseOutcome parsed = pdgate::sim::parse_args(args);
  if (parsed.help) {
    std::fputs(pdgate::sim::usage_text().c_str(), stdout);
    return 0;
  }
  if (!parsed.options) {
    std::fprintf(stderr, "pdgate-sim: %s\n(see pdgate-sim --help)\n", parsed.error.c_str());
    return 2;
  }
  return pdgate::sim::run_server(*parsed.options);
}
