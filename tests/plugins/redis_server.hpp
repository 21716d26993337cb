// A real redis-server for tests, on a free port of 127.0.0.1, with no
// persistence. It can be killed, frozen and restarted on the same port to
// test how the gateway lives through Redis outages.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/harness.hpp"

namespace pdgate::test {

class RedisServer {
 public:
  // `extra`: more redis-server flags (e.g. {"--requirepass", "pw"}).
  explicit RedisServer(std::vector<std::string> extra = {});
  ~RedisServer();

  std::uint16_t port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  // SIGKILL, as an outage looks to clients: connections reset at once.
  void kill();
  // Starts again on the same port with the same flags (empty data).
  void restart();
  // SIGSTOP / SIGCONT: a server that accepts bytes and never answers.
  void freeze();
  void thaw();
  bool running() const { return proc_ != nullptr; }

  // Runs redis-cli against this server and returns its trimmed stdout.
  std::string cli(const std::string& args) const;

 private:
  void start();

  std::vector<std::string> extra_;
  std::uint16_t port_ = 0;
  std::unique_ptr<Process> proc_;
};

}  // namespace pdgate::test
