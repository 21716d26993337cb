// The repository's layers and the README's account of them: core/ never
// includes plugins/ (implementations depend on core's interfaces, not the
// other way), and the README's layout table names every top-level folder,
// only folders that exist, and only core/ files that exist (in any of its
// folders).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The rows of README.md's "Repository layout" table: path -> contents.
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

TEST(RepositoryLayout, CoreIncludesNothingFromPlugins) {
  std::size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(kRoot / "core")) {
    const auto ext = e.path().extension();
    if (!e.is_regular_file() || (ext != ".hpp" && ext != ".cpp"))
      continue;
    ++files;
    std::istringstream text(read_file(e.path()));
    std::string line;
    while (std::getline(text, line)) {
      const auto first = line.find_first_not_of(" \t");
      if (first == std::string::npos || line.compare(first, 8, "#include") != 0)
        continue;
      EXPECT_EQ(line.find("\"plugins/"), std::string::npos) << e.path() << ": " << line;
    }
  }
  EXPECT_GT(files, 50u);
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

TEST(RepositoryLayout, ReadmeCoreRowNamesFilesThatExist) {
  std::string core;
  for (const auto& [path, contents] : layout_rows()) {
    if (path == "core/")
      core = contents;
  }
  ASSERT_FALSE(core.empty());
  // `name.*`, `name.hpp`, `name.cpp` as the row spells them.
  const std::regex file("`([a-z0-9_]+)\\.(\\*|hpp|cpp)`");
  std::size_t checked = 0;
  for (std::sregex_iterator it(core.begin(), core.end(), file), end; it != end; ++it) {
    const std::string stem = (*it)[1];
    const std::string ext = (*it)[2];
    bool exists = false;
    for (const auto& e : fs::recursive_directory_iterator(kRoot / "core")) {
      const auto name = e.path().filename().string();
      exists = exists || (ext == "*" ? name == stem + ".hpp" || name == stem + ".cpp"
                                     : name == stem + "." + ext);
    }
    EXPECT_TRUE(exists) << "the README names core/" << stem << "." << ext;
    ++checked;
  }
  EXPECT_GT(checked, 10u);
}

}  // namespace
}  // namespace pdgate
