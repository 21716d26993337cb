// What the policy tests that run a real gateway share: a chat body, a
// client key header, one series of /metrics, a policy script on disk.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "tests/integration/harness.hpp"

namespace pdgate::test {

inline Json user_chat(const std::string& content, int max_tokens = 4) {
  return {{"model", "sim-model"},
          {"messages", Json::array({{{"role", "user"}, {"content", content}}})},
          {"max_tokens", max_tokens}};
}

inline Headers with_key(const std::string& key) {
  return {{"authorization", "Bearer " + key}};
}

// The value of one series in /metrics text, -1 when absent.
inline double metric(std::uint16_t port, const std::string& series) {
  const std::string body = get(port, "/metrics").body;
  const auto at = body.find("\n" + series + " ");
  return at == std::string::npos ? -1 : std::stod(body.substr(at + series.size() + 2));
}

// A file's whole text ("" when it cannot be read).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A policy script in a fresh directory.
struct Script : EditedFile {
  explicit Script(const std::string& text, const std::string& name = "hook.lua")
      : EditedFile(name, text) {}
};

}  // namespace pdgate::test
