#include "tests/robustness/util.hpp"

#include <dirent.h>

#include <fstream>
#include <sstream>

#include "tests/integration/harness.hpp"

namespace pdgate::test {

std::int64_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stoll(line.substr(6));
  }
  return 0;
}

int fd_count(pid_t pid) {
  int n = 0;
  if (DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (readdir(d) != nullptr)
      ++n;
    closedir(d);
  }
  return n > 2 ? n - 2 : 0;  // "." and ".."
}

double metric(std::uint16_t port, const std::string& series) {
  const auto text = get(port, "/metrics").body;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ')
      return std::stod(line.substr(series.size() + 1));
  }
  return 0;
}

}  // namespace pdgate::test
