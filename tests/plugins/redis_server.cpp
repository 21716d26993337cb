#include "tests/plugins/redis_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace pdgate::test {

namespace {

// True when a PING on a fresh connection gets +PONG (or -NOAUTH: the
// server is up, it just wants a password).
bool answers_ping(std::uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return false;
  timeval tv{0, 200'000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = false;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const char ping[] = "PING\r\n";
    if (write(fd, ping, sizeof ping - 1) == static_cast<ssize_t>(sizeof ping - 1)) {
      char buf[64];
      const ssize_t n = read(fd, buf, sizeof buf);
      ok = n > 0 && (buf[0] == '+' || std::string(buf, n).find("NOAUTH") != std::string::npos);
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace

std::string RedisTls::cli_flags() const {
  std::string f = "--tls --cacert " + ca;
  if (require_client_cert)
    f += " --cert " + client_cert + " --key " + client_key;
  return f;
}

std::vector<std::string> RedisTls::server_flags(std::uint16_t port) const {
  return {"port",
          "0",
          "tls-port",
          std::to_string(port),
          "tls-cert-file",
          cert,
          "tls-key-file",
          key,
          "tls-ca-cert-file",
          ca,
          "tls-auth-clients",
          require_client_cert ? "yes" : "no",
          "tls-replication",
          "yes"};
}

RedisServer::RedisServer(std::vector<std::string> extra, std::optional<RedisTls> tls)
    : extra_(std::move(extra)), tls_(std::move(tls)) {
  port_ = closed_port();
  start();
}

RedisServer::~RedisServer() {
  if (proc_)
    thaw();
}

void RedisServer::start() {
  std::vector<std::string> argv = {
      "/usr/bin/redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "",
      "--appendonly",          "no",     "--loglevel",          "warning"};
  argv.insert(argv.end(), extra_.begin(), extra_.end());
  if (tls_) {
    // The TLS port instead of the plain one (the later --port wins).
    const auto flags = tls_->server_flags(port_);
    for (std::size_t i = 0; i + 1 < flags.size(); i += 2) {
      argv.push_back("--" + flags[i]);
      argv.push_back(flags[i + 1]);
    }
  }
  proc_ = std::make_unique<Process>("redis-server", argv);
  const auto up = [&] { return tls_ ? cli("ping") == "PONG" : answers_ping(port_); };
  if (!eventually(up, std::chrono::seconds(10))) {
    throw std::runtime_error("redis-server did not start on port " + std::to_string(port_) + ": " +
                             proc_->log());
  }
}

void RedisServer::kill() {
  if (!proc_)
    return;
  proc_->signal(SIGCONT);
  proc_->signal(SIGKILL);
  proc_->wait();
  proc_.reset();
}

void RedisServer::restart() {
  kill();
  start();
}

void RedisServer::freeze() {
  if (proc_)
    proc_->signal(SIGSTOP);
}

void RedisServer::thaw() {
  if (proc_)
    proc_->signal(SIGCONT);
}

std::string RedisServer::cli(const std::string& args) const {
  return redis_cli(port_, args, tls_ ? tls_->cli_flags() : std::string());
}

std::string redis_cli(std::uint16_t port, const std::string& args, const std::string& flags) {
  const std::string cmd =
      "timeout 10 redis-cli " + flags + " -p " + std::to_string(port) + " " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr)
    return {};
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p) != nullptr)
    out += buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r'))
    out.pop_back();
  return out;
}

bool have_redis_sentinel() {
  return access("/usr/bin/redis-sentinel", X_OK) == 0;
}

RedisSentinel::RedisSentinel(std::uint16_t master_port, std::string master_name,
                             std::optional<RedisTls> tls)
    : master_name_(std::move(master_name)), tls_(std::move(tls)) {
  char tmpl[] = "/tmp/pdgate-sentinel.XXXXXX";
  if (mkdtemp(tmpl) == nullptr)
    throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  port_ = closed_port();
  const std::string conf = dir_ + "/sentinel.conf";
  {
    std::ofstream f(conf);
    f << "port " << port_ << "\nbind 127.0.0.1\ndir " << dir_ << "\nloglevel warning\n"
      << "sentinel monitor " << master_name_ << " 127.0.0.1 " << master_port << " 1\n"
      << "sentinel down-after-milliseconds " << master_name_ << " 1000\n"
      << "sentinel failover-timeout " << master_name_ << " 10000\n"
      << "sentinel parallel-syncs " << master_name_ << " 1\n";
    if (tls_) {
      const auto flags = tls_->server_flags(port_);
      for (std::size_t i = 0; i + 1 < flags.size(); i += 2)
        f << flags[i] << " " << flags[i + 1] << "\n";
    }
  }
  proc_ = std::make_unique<Process>("redis-sentinel",
                                    std::vector<std::string>{"/usr/bin/redis-sentinel", conf});
  const auto up = [&] { return tls_ ? cli("ping") == "PONG" : answers_ping(port_); };
  if (!eventually(up, std::chrono::seconds(10))) {
    throw std::runtime_error("redis-sentinel did not start on port " + std::to_string(port_) +
                             ": " + proc_->log());
  }
}

RedisSentinel::~RedisSentinel() {
  if (proc_) {
    proc_->signal(SIGKILL);
    proc_->wait();
  }
  std::filesystem::remove_all(dir_);
}

std::string RedisSentinel::cli(const std::string& args) const {
  return redis_cli(port_, args, tls_ ? tls_->cli_flags() : std::string());
}

std::uint16_t RedisSentinel::master_port() const {
  // Two lines: the host, then the port.
  const std::string out = cli("sentinel get-master-addr-by-name " + master_name_);
  const auto nl = out.find('\n');
  if (nl == std::string::npos)
    return 0;
  try {
    return static_cast<std::uint16_t>(std::stoi(out.substr(nl + 1)));
  } catch (...) {
    return 0;
  }
}

}  // namespace pdgate::test
