// What the robustness tests measure on a running process: its memory, its
// open descriptors, and a series of its Prometheus text.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace pdgate::test {

// Resident set size of `pid` in KiB (VmRSS), 0 if the process is gone.
std::int64_t rss_kib(pid_t pid);
// Open file descriptors of `pid`.
int fd_count(pid_t pid);
// The value of one series of GET /metrics on `port`, written as it appears
// before its value (`name` or `name{label="v",...}`); 0 when absent.
double metric(std::uint16_t port, const std::string& series);

}  // namespace pdgate::test
