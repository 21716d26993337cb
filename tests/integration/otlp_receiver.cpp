#include "tests/integration/otlp_receiver.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <strings.h>
#include <cstdlib>
#include <stdexcept>

namespace pdgate::test {

namespace {

// The Content-Length of a request head, -1 when absent.
long content_length(const std::string& head) {
  std::size_t at = 0;
  while ((at = head.find("\r\n", at)) != std::string::npos) {
    at += 2;
    constexpr char kName[] = "content-length:";
    if (strncasecmp(head.c_str() + at, kName, sizeof kName - 1) == 0)
      return std::strtol(head.c_str() + at + sizeof kName - 1, nullptr, 10);
  }
  return -1;
}

}  // namespace

OtlpReceiver::OtlpReceiver(Mode mode) : mode_(mode) {
  listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(listener_, 64) != 0 ||
      ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw std::runtime_error("OtlpReceiver: cannot listen");
  }
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this] { run(); });
}

OtlpReceiver::~OtlpReceiver() {
  stop_ = true;
  thread_.join();
  ::close(listener_);
}

void OtlpReceiver::run() {
  struct Client {
    int fd;
    std::string in;
  };
  std::vector<Client> clients;
  while (!stop_) {
    std::vector<pollfd> fds{{listener_, POLLIN, 0}};
    for (const auto& c : clients)
      fds.push_back({c.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 50) <= 0)
      continue;
    if (fds[0].revents & POLLIN) {
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd >= 0)
        clients.push_back({fd, {}});
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      Client& c = clients[i - 1];
      char buf[65536];
      const ssize_t n = ::read(c.fd, buf, sizeof buf);
      if (n <= 0) {
        ::close(c.fd);
        c.fd = -1;
        continue;
      }
      c.in.append(buf, static_cast<std::size_t>(n));
      // Every complete request in the buffer.
      for (;;) {
        const std::size_t end = c.in.find("\r\n\r\n");
        if (end == std::string::npos)
          break;
        const long length = content_length(c.in.substr(0, end + 2));
        const std::size_t total = end + 4 + static_cast<std::size_t>(length < 0 ? 0 : length);
        if (c.in.size() < total)
          break;
        {
          std::lock_guard lock(mu_);
          bodies_.push_back(c.in.substr(end + 4, total - end - 4));
        }
        c.in.erase(0, total);
        if (mode_ == Mode::answer) {
          static const std::string kOk =
              "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
          (void)::write(c.fd, kOk.data(), kOk.size());
        }
      }
    }
    std::erase_if(clients, [](const Client& c) { return c.fd < 0; });
  }
  for (const auto& c : clients)
    ::close(c.fd);
}

std::vector<Json> OtlpReceiver::spans() {
  std::vector<std::string> bodies;
  {
    std::lock_guard lock(mu_);
    bodies = bodies_;
  }
  std::vector<Json> out;
  for (const auto& b : bodies) {
    const Json j = Json::parse(b);
    for (const auto& rs : j.at("resourceSpans"))
      for (const auto& ss : rs.at("scopeSpans"))
        for (const auto& s : ss.at("spans"))
          out.push_back(s);
  }
  return out;
}

std::vector<Json> OtlpReceiver::trace(const std::string& trace_id) {
  std::vector<Json> out;
  for (auto& s : spans()) {
    if (s.value("traceId", "") == trace_id)
      out.push_back(std::move(s));
  }
  return out;
}

std::size_t OtlpReceiver::requests() {
  std::lock_guard lock(mu_);
  return bodies_.size();
}

}  // namespace pdgate::test
