// Fake instance sets and scripts on disk for the policy tests.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/upstream/instance.hpp"
#include "policies/engine.hpp"

namespace pdgate::policy::test {

inline std::vector<InstancePtr> fake_instances(std::size_t n, Role role = Role::decode,
                                               std::uint64_t first_id = 1) {
  std::vector<InstancePtr> out;
  for (std::size_t i = 0; i < n; ++i) {
    UpstreamSpec spec;
    spec.role = role;
    spec.host = "10.0.0." + std::to_string(i + 1);
    spec.port = 8000;
    spec.url = "http://" + spec.host + ":8000";
    out.push_back(std::make_shared<Instance>(first_id + i, spec));
  }
  return out;
}

inline PolicySettings settings_for(const std::string& spec) {
  PolicySettings s;
  s.specs = {spec, spec, spec};
  return s;
}

// An engine running `spec` for every stage; fails the test if it cannot load.
inline std::shared_ptr<PolicyEngine> engine_for(const std::string& spec) {
  auto e = PolicyEngine::create(settings_for(spec));
  if (!e) {
    ADD_FAILURE() << e.error();
    return nullptr;
  }
  return *e;
}

// A script file in a fresh temporary directory, removed with it.
class TempScript {
 public:
  explicit TempScript(const std::string& text, const std::string& name = "policy") {
    dir_ = std::filesystem::temp_directory_path() /
           ("pdgate_policy_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / (name + ".lua")).string();
    write(text);
  }
  ~TempScript() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Rewrites the file; bumps its mtime so a poll surely sees the change
  // even within the file system's timestamp granularity.
  void write(const std::string& text) {
    { std::ofstream(path_, std::ios::trunc) << text; }
    std::error_code ec;
    const auto t = std::filesystem::last_write_time(path_, ec);
    std::filesystem::last_write_time(path_, t + std::chrono::seconds(++bumps_), ec);
  }
  const std::string& path() const { return path_; }
  std::string dir() const { return dir_.string(); }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path dir_;
  std::string path_;
  int bumps_ = 0;
};

}  // namespace pdgate::policy::test
