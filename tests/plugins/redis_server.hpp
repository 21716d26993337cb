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

// redis-cli against a server or sentinel on 127.0.0.1:`port`, trimmed stdout.
std::string redis_cli(std::uint16_t port, const std::string& args);

// A real Redis Sentinel (Debian's redis-sentinel) on a free port of
// 127.0.0.1, watching one master under the name `master_name`, quick to
// call it down (1 s) so failover tests stay short. Its config lives in a
// temporary directory (Sentinel rewrites it as it learns).
class RedisSentinel {
 public:
  RedisSentinel(std::uint16_t master_port, std::string master_name = "mymaster");
  ~RedisSentinel();

  std::uint16_t port() const { return port_; }
  // Runs redis-cli against this sentinel and returns its trimmed stdout.
  std::string cli(const std::string& args) const;
  // The port of the master as this sentinel sees it (0 if unknown).
  std::uint16_t master_port() const;

 private:
  std::string dir_;
  std::string master_name_;
  std::uint16_t port_ = 0;
  std::unique_ptr<Process> proc_;
};

// Whether Debian's redis-sentinel is installed (tests skip without it).
bool have_redis_sentinel();

}  // namespace pdgate::test
