// The sim's HTTP server. Everything Asio/Beast lives in server.cpp (one
// slow-to-compile translation unit); this header stays light so main.cpp
// compiles fast.
#pragma once

#include "sim/options.hpp"

namespace pdgate::sim {

// Binds, prints "pdgate-sim listening on http://HOST:PORT" to stdout, serves
// until SIGINT/SIGTERM. Returns the process exit code.
int run_server(const SimOptions& opts);

}  // namespace pdgate::sim
