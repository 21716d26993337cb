#include "tests/integration/harness.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace pdgate::test {

std::string build_dir() {
  const char* d = std::getenv("PDGATE_BUILD_DIR");
  return d ? d : PDGATE_DEFAULT_BUILD_DIR;
}

std::string source_dir() {
  const char* d = std::getenv("PDGATE_SOURCE_DIR");
  return d ? d : PDGATE_DEFAULT_SOURCE_DIR;
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

int remaining_ms(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(ms);
}

std::string lower(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Process::Process(std::string name, std::vector<std::string> argv,
                 std::map<std::string, std::string> extra_env)
    : name_(std::move(name)) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe failed");
  char tmpl[] = "/tmp/pdgate-test-XXXXXX";
  int log_fd = mkstemp(tmpl);
  if (log_fd < 0)
    throw std::runtime_error("mkstemp failed");
  log_path_ = tmpl;

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto key = kv.substr(0, kv.find('='));
    if (!extra_env.count(key))
      env_store.push_back(kv);
  }
  for (auto& [k, v] : extra_env) {
    if (v != "<unset>")
      env_store.push_back(k + "=" + v);
  }
  std::vector<char*> envp;
  for (auto& s : env_store)
    envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (auto& a : argv)
    args.push_back(a.data());
  args.push_back(nullptr);
  int rc = posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  close(log_fd);
  if (rc != 0) {
    close(out[0]);
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  stdout_fd_ = out[0];
}

Process::~Process() {
  if (!reaped_ && pid_ > 0) {
    signal(SIGTERM);
    if (wait(std::chrono::seconds(5)) == -1) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
    }
  }
  if (stdout_fd_ >= 0)
    close(stdout_fd_);
  // A sanitizer report in a child (a leak at exit, a UBSan finding, an
  // ASan error in a thread the test never noticed) fails the test that ran
  // it: under ASan+UBSan the suite checks the gateway and the sim, not only
  // the test binaries.
  const std::string text = log();
  for (const char* mark :
       {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer", ": runtime error: "}) {
    const auto at = text.find(mark);
    if (at != std::string::npos) {
      ADD_FAILURE() << name_ << " printed a sanitizer report:\n"
                    << text.substr(at > 2000 ? at - 2000 : 0, 8000);
      break;
    }
  }
  if (std::getenv("PDGATE_KEEP_LOGS") == nullptr)
    unlink(log_path_.c_str());
}

std::uint16_t Process::wait_listening(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  static const std::regex re(R"(listening on https?://[^\s]*:(\d+))");
  for (;;) {
    auto nl = pending_.find('\n');
    while (nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      std::smatch m;
      if (std::regex_search(line, m, re))
        return static_cast<std::uint16_t>(std::stoi(m[1]));
      nl = pending_.find('\n');
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    int r = poll(&p, 1, remaining_ms(deadline));
    if (r <= 0) {
      throw std::runtime_error(name_ + " did not report listening in time; log:\n" + log());
    }
    char buf[4096];
    auto n = read(stdout_fd_, buf, sizeof buf);
    if (n <= 0)
      throw std::runtime_error(name_ + " exited before listening; log:\n" + log());
    pending_.append(buf, static_cast<std::size_t>(n));
  }
}

void Process::signal(int sig) {
  if (!reaped_ && pid_ > 0)
    ::kill(pid_, sig);
}

int Process::wait(std::chrono::milliseconds timeout) {
  if (reaped_)
    return status_;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    pid_t r = waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return status_;
    }
    if (Clock::now() >= deadline)
      return -1;
    usleep(10'000);
  }
}

bool Process::running() {
  if (reaped_)
    return false;
  return waitpid(pid_, &status_, WNOHANG) == 0 || (reaped_ = false);
}

std::string Process::log() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// --- HTTP client -----------------------------------------------------------

struct Connection::Impl {
  int fd = -1;
  std::string buf;  // received, not yet consumed
  // Body framing of the response being read.
  bool chunked = false;
  bool until_close = false;
  std::size_t remaining = 0;  // content-length left, or bytes left in the chunk
  bool body_done = false;

  bool fill(Clock::time_point deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, remaining_ms(deadline)) <= 0)
      throw std::runtime_error("read timed out");
    char tmp[65536];
    auto n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0)
      return false;
    buf.append(tmp, static_cast<std::size_t>(n));
    return true;
  }
};

Connection::Connection(std::uint16_t port) : impl_(std::make_unique<Impl>()) {
  impl_->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(impl_->fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const int err = errno;
    ::close(impl_->fd);
    impl_->fd = -1;
    throw std::runtime_error("connect to port " + std::to_string(port) +
                             " failed: " + std::strerror(err));
  }
  int one = 1;
  setsockopt(impl_->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Connection::~Connection() {
  close();
}

void Connection::close() {
  if (impl_->fd >= 0)
    ::close(impl_->fd);
  impl_->fd = -1;
}

void Connection::send_raw(const std::string& bytes) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    auto n = ::send(impl_->fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0)
      throw std::runtime_error("send failed");
    off += static_cast<std::size_t>(n);
  }
}

void Connection::send_request(const std::string& method, const std::string& target,
                              const std::string& body, const Headers& headers) {
  std::string r = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  bool has_ct = false;
  for (auto& [k, v] : headers) {
    r += k + ": " + v + "\r\n";
    if (lower(k) == "content-type")
      has_ct = true;
  }
  if (!body.empty() || method == "POST") {
    if (!has_ct)
      r += "Content-Type: application/json\r\n";
    r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  r += "\r\n" + body;
  send_raw(r);
}

Response Connection::read_head(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto& im = *impl_;
  std::size_t end;
  while ((end = im.buf.find("\r\n\r\n")) == std::string::npos) {
    if (!im.fill(deadline))
      throw std::runtime_error("connection closed before response head");
  }
  Response r;
  std::string head = im.buf.substr(0, end);
  im.buf.erase(0, end + 4);
  std::istringstream in(head);
  std::string line;
  std::getline(in, line);
  r.status = std::stoi(line.substr(9, 3));
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    auto c = line.find(':');
    if (c == std::string::npos)
      continue;
    std::string v = line.substr(c + 1);
    while (!v.empty() && v.front() == ' ')
      v.erase(0, 1);
    r.headers[lower(line.substr(0, c))] = v;
  }
  im.chunked = lower(r.header("transfer-encoding")).find("chunked") != std::string::npos;
  im.body_done = false;
  im.until_close = false;
  im.remaining = 0;
  if (!im.chunked) {
    if (r.headers.count("content-length")) {
      im.remaining = std::stoul(r.header("content-length"));
      im.body_done = im.remaining == 0;
    } else if (r.status == 204 || r.status == 304 || r.status / 100 == 1) {
      im.body_done = true;
    } else {
      im.until_close = true;
    }
  }
  return r;
}

std::string Connection::read_body_some(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto& im = *impl_;
  std::string out;
  while (!im.body_done) {
    if (im.until_close) {
      if (!im.buf.empty()) {
        out.swap(im.buf);
        return out;
      }
      if (!im.fill(deadline))
        im.body_done = true;
      continue;
    }
    if (!im.chunked) {
      if (im.buf.empty() && !im.fill(deadline))
        throw std::runtime_error("body cut short");
      auto take = std::min(im.remaining, im.buf.size());
      out = im.buf.substr(0, take);
      im.buf.erase(0, take);
      im.remaining -= take;
      if (im.remaining == 0)
        im.body_done = true;
      return out;
    }
    // Chunked: decode whole chunks as they are available.
    if (im.remaining > 0) {
      if (im.buf.empty() && !im.fill(deadline))
        throw std::runtime_error("chunk cut short");
      auto take = std::min(im.remaining, im.buf.size());
      out += im.buf.substr(0, take);
      im.buf.erase(0, take);
      im.remaining -= take;
      if (im.remaining == 0) {
        while (im.buf.size() < 2) {
          if (!im.fill(deadline))
            throw std::runtime_error("chunk cut short");
        }
        im.buf.erase(0, 2);  // CRLF after the chunk data
      }
      if (!out.empty())
        return out;
      continue;
    }
    auto nl = im.buf.find("\r\n");
    if (nl == std::string::npos) {
      if (!im.fill(deadline))
        throw std::runtime_error("chunked body cut short");
      continue;
    }
    std::size_t size = std::stoul(im.buf.substr(0, nl), nullptr, 16);
    im.buf.erase(0, nl + 2);
    if (size == 0) {
      // Trailers end with an empty line.
      while (im.buf.find("\r\n") == std::string::npos) {
        if (!im.fill(deadline))
          break;
      }
      auto e = im.buf.find("\r\n");
      if (e != std::string::npos)
        im.buf.erase(0, e + 2);
      im.body_done = true;
      return out;
    }
    im.remaining = size;
  }
  return out;
}

Response Connection::read_response(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  Response r = read_head(timeout);
  for (;;) {
    auto piece = read_body_some(std::chrono::milliseconds(remaining_ms(deadline)));
    if (piece.empty() && impl_->body_done)
      break;
    r.body += piece;
  }
  return r;
}

bool Connection::peer_closed(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  try {
    while (impl_->fill(deadline)) {
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

Response http_request(std::uint16_t port, const std::string& method, const std::string& target,
                      const std::string& body, const Headers& headers,
                      std::chrono::milliseconds timeout) {
  Connection c(port);
  c.send_request(method, target, body, headers);
  return c.read_response(timeout);
}

Response post_json(std::uint16_t port, const std::string& target, const Json& body,
                   const Headers& headers) {
  return http_request(port, "POST", target, body.dump(), headers);
}

Response get(std::uint16_t port, const std::string& target) {
  return http_request(port, "GET", target);
}

std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < body.size()) {
    auto end = body.find("\n\n", pos);
    std::string ev = body.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? body.size() : end + 2;
    std::istringstream in(ev);
    std::string line, data;
    bool has = false;
    while (std::getline(in, line)) {
      if (line.rfind("data:", 0) == 0) {
        std::string v = line.substr(5);
        if (!v.empty() && v[0] == ' ')
          v.erase(0, 1);
        data += (has ? "\n" : "") + v;
        has = true;
      }
    }
    if (has)
      out.push_back(data);
  }
  return out;
}

// --- processes -------------------------------------------------------------

Sim::Sim(const std::string& role, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      build_dir() + "/pdgate-sim", "--role", role, "--host", "127.0.0.1", "--port", "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  proc_ = std::make_unique<Process>("pdgate-sim(" + role + ")", argv);
  port_ = proc_->wait_listening();
}

Json Sim::requests() {
  Json all = get(port_, "/sim/requests").json();
  Json out = Json::array();
  for (auto& r : all) {
    const std::string path = r.value("path", "");
    const std::string route = path.substr(0, path.find('?'));
    if (route == "/v1/completions" || route == "/v1/chat/completions")
      out.push_back(r);
  }
  return out;
}

Json Sim::stats() {
  return get(port_, "/sim/stats").json();
}

void Sim::clear() {
  http_request(port_, "DELETE", "/sim/requests");
}

Gateway::Gateway(std::vector<std::string> args, std::map<std::string, std::string> env) {
  std::vector<std::string> argv = {
      build_dir() + "/pdgate", "--host", "127.0.0.1", "--port", "0", "--workers", "2"};
  argv.insert(argv.end(), args.begin(), args.end());
  if (auto it = env.find("ADMIN_API_KEY"); it != env.end())
    admin_key_ = it->second;
  proc_ = std::make_unique<Process>("pdgate", argv, std::move(env));
  port_ = proc_->wait_listening();
}

Json Gateway::status() {
  Headers h;
  if (!admin_key_.empty())
    h.emplace_back("X-API-Key", admin_key_);
  return http_request(port_, "GET", "/status", {}, h).json();
}

std::uint16_t closed_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);  // bound but never listening, then released: connects are refused
  return ntohs(a.sin_port);
}

bool have_ipv6_loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0)
    return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

EditedFile::EditedFile(const std::string& name, const std::string& text) {
  static std::atomic<int> n{0};
  dir_ = (std::filesystem::temp_directory_path() /
          ("pdgate_edited_" + std::to_string(::getpid()) + "_" + std::to_string(n++)))
             .string();
  std::filesystem::create_directories(dir_);
  path_ = (std::filesystem::path(dir_) / name).string();
  write(text);
}

EditedFile::~EditedFile() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void EditedFile::write(const std::string& text) {
  const std::string tmp = path_ + ".tmp";
  { std::ofstream(tmp, std::ios::trunc) << text; }
  std::filesystem::rename(tmp, path_);
  std::error_code ec;
  const auto t = std::filesystem::last_write_time(path_, ec);
  std::filesystem::last_write_time(path_, t + std::chrono::seconds(++bumps_), ec);
}

double metric_sample(std::uint16_t port, const std::string& name, const std::string& labels) {
  std::istringstream in(get(port, "/metrics").body);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(name + "{") || line.find(labels) == std::string::npos)
      continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

}  // namespace pdgate::test
