// The sim's HTTP server. Its Asio/Beast code lives in server.cpp and the
// files it hands requests to (sim/CMakeLists.txt lists them); this header
// stays light so main.cpp compiles fast.
#pragma once

#include "sim/options.hpp"

namespace pdgate::sim {

// Binds, prints "pdgate-sim listening on http://HOST:PORT" to stdout, serves
// until SIGINT/SIGTERM. Returns the process exit code.
int run_server(const SimOptions& opts);

}  // namespace pdgate::sim
