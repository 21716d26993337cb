// A real redis-server for tests, on a free port of 127.0.0.1, with no
// persistence. It can be killed, frozen and restarted on the same port to
// test how the gateway lives through Redis outages.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/integration/harness.hpp"

namespace pdgate::test {

// TLS for a server or a sentinel (its only port then): its certificate
// and key, the CA its peers' certificates must chain to, and whether
// clients must present one (redis-cli then presents `client_cert`).
// Replication and Sentinel's connections use TLS too.
struct RedisTls {
  std::string cert, key, ca;
  bool require_client_cert = false;
  std::string client_cert, client_key;
  // redis-cli's flags to reach such a server.
  std::string cli_flags() const;
  // redis-server's (and, as config lines, redis-sentinel's) settings.
  std::vector<std::string> server_flags(std::uint16_t port) const;
};

class RedisServer {
 public:
  // `extra`: more redis-server flags (e.g. {"--requirepass", "pw"}).
  explicit RedisServer(std::vector<std::string> extra = {},
                       std::optional<RedisTls> tls = std::nullopt);
  ~RedisServer();

  std::uint16_t port() const { return port_; }
  // redis://127.0.0.1:PORT, or rediss://localhost:PORT over TLS (the
  // name the test certificates carry).
  std::string url() const {
    return (tls_ ? "rediss://localhost:" : "redis://127.0.0.1:") + std::to_string(port_);
  }

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
  std::optional<RedisTls> tls_;
  std::uint16_t port_ = 0;
  std::unique_ptr<Process> proc_;
};

// redis-cli against a server or sentinel on 127.0.0.1:`port`, trimmed
// stdout; `flags` go before the arguments (RedisTls::cli_flags()).
std::string redis_cli(std::uint16_t port, const std::string& args, const std::string& flags = {});

// A real Redis Sentinel (Debian's redis-sentinel) on a free port of
// 127.0.0.1, watching one master under the name `master_name`, quick to
// call it down (1 s) so failover tests stay short. Its config lives in a
// temporary directory (Sentinel rewrites it as it learns).
class RedisSentinel {
 public:
  RedisSentinel(std::uint16_t master_port, std::string master_name = "mymaster",
                std::optional<RedisTls> tls = std::nullopt);
  ~RedisSentinel();

  std::uint16_t port() const { return port_; }
  // Runs redis-cli against this sentinel and returns its trimmed stdout.
  std::string cli(const std::string& args) const;
  // The port of the master as this sentinel sees it (0 if unknown).
  std::uint16_t master_port() const;

 private:
  std::string dir_;
  std::string master_name_;
  std::optional<RedisTls> tls_;
  std::uint16_t port_ = 0;
  std::unique_ptr<Process> proc_;
};

// Whether Debian's redis-sentinel is installed (tests skip without it).
bool have_redis_sentinel();

}  // namespace pdgate::test
