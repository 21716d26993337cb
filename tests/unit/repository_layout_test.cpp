// The repository's layers and the README's account of them.
// - core/ is made of wings, folders that each do one job and depend only
//   on the wings below them (kWings, lowest first): an include from a
//   lower wing into a higher one, or a file outside every wing, fails.
// - core/ never includes plugins/ or policies/ (implementations depend on
//   core's interfaces, not the other way).
// - The README's layout table names every top-level folder and every
//   wing, in order, only folders that exist, and only files that exist in
//   the wing whose row names them.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace pdgate {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = PDGATE_TEST_SOURCE_DIR;

// core/'s wings, lowest first, with their level: a wing may include its
// own files and those of wings on a lower level. config and observability
// share a level and so may not include each other.
struct Wing {
  const char* name;
  int level;
};
constexpr Wing kWings[] = {
    {"base", 0},    {"config", 1},   {"observability", 1}, {"net", 2},
    {"routing", 3}, {"upstream", 4}, {"pipeline", 5},      {"gateway", 6},
};

int level_of(const std::string& wing) {
  for (const auto& w : kWings) {
    if (wing == w.name)
      return w.level;
  }
  return -1;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool is_source(const fs::path& p) {
  return p.extension() == ".hpp" || p.extension() == ".cpp";
}

// The quoted includes of a source file, as written ("core/net/sse.hpp").
std::vector<std::string> quoted_includes(const fs::path& file) {
  std::vector<std::string> out;
  std::istringstream text(read_file(file));
  std::string line;
  while (std::getline(text, line)) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line.compare(first, 8, "#include") != 0)
      continue;
    const auto open = line.find('"', first);
    const auto close = open == std::string::npos ? open : line.find('"', open + 1);
    if (close != std::string::npos)
      out.push_back(line.substr(open + 1, close - open - 1));
  }
  return out;
}

// What is wrong with `file`'s includes, given the wing it lives in: one
// line per include that reaches up or out of core/.
std::vector<std::string> layering_faults(const fs::path& file, const std::string& wing) {
  std::vector<std::string> faults;
  const int level = level_of(wing);
  for (const auto& inc : quoted_includes(file)) {
    if (inc.rfind("plugins/", 0) == 0 || inc.rfind("policies/", 0) == 0) {
      faults.push_back(inc + " (core never includes plugins/ or policies/)");
      continue;
    }
    if (inc.rfind("core/", 0) != 0)
      continue;
    const auto slash = inc.find('/', 5);
    const std::string to = slash == std::string::npos ? "" : inc.substr(5, slash - 5);
    const int to_level = level_of(to);
    if (to_level < 0)
      faults.push_back(inc + " (not in a wing)");
    else if (to != wing && to_level >= level)
      faults.push_back(inc + " (wing " + to + " is not below " + wing + ")");
  }
  return faults;
}

// The rows of README.md's "Repository layout" table, in order:
// path -> contents.
std::vector<std::pair<std::string, std::string>> layout_rows() {
  const std::string readme = read_file(kRoot / "README.md");
  const auto start = readme.find("## Repository layout");
  const auto end = readme.find("\n## ", start + 1);
  std::istringstream section(readme.substr(start, end - start));
  std::vector<std::pair<std::string, std::string>> rows;
  std::string line;
  while (std::getline(section, line)) {
    if (line.rfind("| `", 0) != 0)
      continue;
    const auto close = line.find('`', 3);
    rows.emplace_back(line.substr(3, close - 3), line.substr(close + 1));
  }
  return rows;
}

TEST(RepositoryLayout, EveryCoreFileIsInAWing) {
  std::size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(kRoot / "core")) {
    if (!e.is_regular_file() || !is_source(e.path()))
      continue;
    ++files;
    const auto rel = fs::relative(e.path(), kRoot / "core");
    const std::string wing = rel.begin()->string();
    EXPECT_GE(level_of(wing), 0) << "core/" << rel.string() << " is in no wing";
  }
  EXPECT_GT(files, 100u);
}

TEST(RepositoryLayout, WingsIncludeOnlyWingsBelowThem) {
  std::size_t checked = 0;
  for (const auto& w : kWings) {
    const fs::path dir = kRoot / "core" / w.name;
    ASSERT_TRUE(fs::is_directory(dir)) << dir;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (!e.is_regular_file() || !is_source(e.path()))
        continue;
      ++checked;
      for (const auto& fault : layering_faults(e.path(), w.name))
        ADD_FAILURE() << fs::relative(e.path(), kRoot).string() << " includes " << fault;
    }
  }
  EXPECT_GT(checked, 100u);
}

// The check itself: a probe include from a lower wing into a higher one
// is a fault, one into the same or a lower wing is not.
TEST(RepositoryLayout, LayeringCheckCatchesAnUpwardInclude) {
  const fs::path probe = fs::temp_directory_path() / "pdgate_layout_probe.hpp";
  std::ofstream(probe) << "#include \"core/base/result.hpp\"\n"
                       << "#include \"core/net/sse.hpp\"\n"
                       << "#include \"core/pipeline/worker.hpp\"\n"
                       << "#include \"plugins/redis_protocol.hpp\"\n"
                       << "#include \"core/loose.hpp\"\n";
  const auto net_faults = layering_faults(probe, "net");
  EXPECT_EQ(net_faults.size(), 3u);  // pipeline, plugins, loose
  const auto gateway_faults = layering_faults(probe, "gateway");
  EXPECT_EQ(gateway_faults.size(), 2u);  // plugins, loose
  const auto config_faults = layering_faults(probe, "config");
  EXPECT_EQ(config_faults.size(), 4u);  // net, pipeline, plugins, loose
  fs::remove(probe);
}

TEST(RepositoryLayout, ReadmeTableNamesEveryFolder) {
  const auto rows = layout_rows();
  ASSERT_FALSE(rows.empty());
  std::set<std::string> named;
  for (const auto& [path, contents] : rows) {
    EXPECT_TRUE(fs::is_directory(kRoot / path)) << path << " is in the table but not a folder";
    named.insert(path);
  }
  for (const auto& e : fs::directory_iterator(kRoot)) {
    const std::string name = e.path().filename().string();
    // Hidden folders and build trees are no part of the layout.
    if (!e.is_directory() || name.front() == '.' || name.rfind("build", 0) == 0)
      continue;
    EXPECT_TRUE(named.count(name + "/")) << name << "/ is missing from the README's layout table";
  }
}

// One row per wing, lowest first, and one per folder of core/.
TEST(RepositoryLayout, ReadmeTableListsTheWingsInOrder) {
  std::vector<std::string> rows;
  for (const auto& [path, contents] : layout_rows()) {
    if (path.rfind("core/", 0) == 0 && path.size() > 5)
      rows.push_back(path.substr(5, path.size() - 6));  // "core/net/" -> "net"
  }
  std::vector<std::string> wings;
  for (const auto& w : kWings)
    wings.push_back(w.name);
  EXPECT_EQ(rows, wings);
  std::set<std::string> folders;
  for (const auto& e : fs::directory_iterator(kRoot / "core")) {
    if (e.is_directory())
      folders.insert(e.path().filename().string());
  }
  EXPECT_EQ(folders, std::set<std::string>(wings.begin(), wings.end()));
}

// The files a wing's row names (`name.*`, `name.hpp`, `name.cpp`) are in
// that wing.
TEST(RepositoryLayout, ReadmeWingRowsNameFilesOfTheirWing) {
  const std::regex file("`([a-z0-9_]+)\\.(\\*|hpp|cpp)`");
  std::size_t checked = 0;
  for (const auto& [path, contents] : layout_rows()) {
    if (path.rfind("core/", 0) != 0 || path.size() <= 5)
      continue;
    const fs::path dir = kRoot / path;
    for (std::sregex_iterator it(contents.begin(), contents.end(), file), end; it != end; ++it) {
      const std::string stem = (*it)[1];
      const std::string ext = (*it)[2];
      const bool exists =
          ext == "*" ? fs::exists(dir / (stem + ".hpp")) || fs::exists(dir / (stem + ".cpp"))
                     : fs::exists(dir / (stem + "." + ext));
      EXPECT_TRUE(exists) << "the README's " << path << " row names " << stem << "." << ext;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10u);
}

}  // namespace
}  // namespace pdgate
