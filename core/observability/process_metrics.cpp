#include "core/observability/process_metrics.hpp"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/version.hpp>

namespace pdgate {

namespace {

std::string read_small_file(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The fields of /proc/self/stat after the command name (which may hold
// spaces and parentheses, so the split starts after its last ')'):
// fields[0] is the state, field N of proc(5) is fields[N - 3].
std::vector<std::string> stat_fields() {
  const std::string stat = read_small_file("/proc/self/stat");
  const auto close = stat.rfind(')');
  std::vector<std::string> fields;
  if (close == std::string::npos)
    return fields;
  std::istringstream rest(stat.substr(close + 1));
  for (std::string f; rest >> f;)
    fields.push_back(f);
  return fields;
}

double field(const std::vector<std::string>& f, std::size_t proc5_number) {
  const std::size_t i = proc5_number - 3;
  return i < f.size() ? std::strtod(f[i].c_str(), nullptr) : 0.0;
}

// Seconds since the epoch at which the machine booted (/proc/stat btime).
double boot_time() {
  std::istringstream in(read_small_file("/proc/stat"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("btime ", 0) == 0)
      return std::strtod(line.c_str() + 6, nullptr);
  }
  return 0;
}

std::int64_t open_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr)
    return -1;
  std::int64_t n = 0;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] != '.')
      ++n;
  }
  closedir(d);
  return n - 1;  // the directory's own descriptor
}

}  // namespace

void write_process_metrics(PrometheusText& m) {
  const auto f = stat_fields();
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  m.counter("process_cpu_seconds_total", "User and system CPU time spent, in seconds.");
  m.sample("process_cpu_seconds_total", {}, (field(f, 14) + field(f, 15)) / ticks);
  m.gauge("process_resident_memory_bytes", "Resident memory size in bytes.");
  m.sample("process_resident_memory_bytes", {}, field(f, 24) * page);
  m.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.");
  m.sample("process_virtual_memory_bytes", {}, field(f, 23));
  m.gauge("process_start_time_seconds", "Start time of the process since the epoch, in seconds.");
  m.sample("process_start_time_seconds", {}, boot_time() + field(f, 22) / ticks);
  m.gauge("process_open_fds", "Open file descriptors.");
  m.sample("process_open_fds", open_fds());
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    m.gauge("process_max_fds", "Limit on open file descriptors.");
    m.sample("process_max_fds", {}, static_cast<double>(lim.rlim_cur));
  }
}

void write_build_info(PrometheusText& m) {
  char boost[32];
  std::snprintf(boost, sizeof boost, "%d.%d.%d", BOOST_VERSION / 100000, BOOST_VERSION / 100 % 1000,
                BOOST_VERSION % 100);
  m.gauge("pdgate_build_info", "1, labelled with the version pdgate was built as.");
  m.sample("pdgate_build_info",
           {{"version", PDGATE_VERSION}, {"boost", boost}, {"build_type", PDGATE_BUILD_TYPE}},
           std::uint64_t{1});
}

}  // namespace pdgate
