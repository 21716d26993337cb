#include "tests/plugins/redis_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
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

RedisServer::RedisServer(std::vector<std::string> extra) : extra_(std::move(extra)) {
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
  proc_ = std::make_unique<Process>("redis-server", argv);
  if (!eventually([&] { return answers_ping(port_); }, std::chrono::seconds(10))) {
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
  const std::string cmd = "redis-cli -p " + std::to_string(port_) + " " + args + " 2>/dev/null";
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

}  // namespace pdgate::test
