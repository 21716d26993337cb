// Starts real pdgate, pdgate-sim and redis-server processes on 127.0.0.1
// with ephemeral ports, and talks HTTP to them, so integration tests check
// what a user would: bytes delivered, engine-side effects, status codes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pdgate::test {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

std::string build_dir();
std::string source_dir();
std::int64_t now_ms();  // system_clock, as the sim reports times

// A child process; killed (SIGTERM, then SIGKILL) when destroyed.
class Process {
 public:
  Process(std::string name, std::vector<std::string> argv,
          std::map<std::string, std::string> extra_env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Reads stdout until a line contains "listening on http://H:P"; returns P.
  std::uint16_t wait_listening(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // Sends a signal; wait() reaps and returns the exit status (-1 on timeout).
  void signal(int sig);
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  bool running();
  pid_t pid() const { return pid_; }
  std::string log() const;  // everything it wrote to stderr so far

 private:
  std::string name_;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string log_path_;
  std::string pending_;
  bool reaped_ = false;
  int status_ = 0;
};

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;
  Json json() const { return Json::parse(body); }
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// One request on a fresh connection.
Response http_request(std::uint16_t port, const std::string& method, const std::string& target,
                      const std::string& body = {}, const Headers& headers = {},
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));
Response post_json(std::uint16_t port, const std::string& target, const Json& body,
                   const Headers& headers = {});
Response get(std::uint16_t port, const std::string& target);

// A client connection kept open across requests (keep-alive checks) or
// read piece by piece (streaming checks).
class Connection {
 public:
  explicit Connection(std::uint16_t port);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void send_raw(const std::string& bytes);
  void send_request(const std::string& method, const std::string& target, const std::string& body,
                    const Headers& headers = {});
  // Reads a whole response (Content-Length or chunked).
  Response read_response(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Reads the response head; the body is then read with read_body_some().
  Response read_head(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Decoded (de-chunked) body bytes as they arrive; empty at the end.
  std::string read_body_some(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  void close();
  bool peer_closed(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// SSE "data:" payloads of an event-stream body, in order.
std::vector<std::string> sse_data(const std::string& body);

// A pdgate-sim process.
class Sim {
 public:
  Sim(const std::string& role, std::vector<std::string> extra = {});
  std::uint16_t port() const { return port_; }
  std::string hostport() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string url() const { return "http://" + hostport(); }
  Json requests();  // GET /sim/requests, completion requests only
  Json stats();
  void clear();
  Process& process() { return *proc_; }

 private:
  std::unique_ptr<Process> proc_;
  std::uint16_t port_ = 0;
};

// A pdgate process.
class Gateway {
 public:
  explicit Gateway(std::vector<std::string> args, std::map<std::string, std::string> env = {});
  std::uint16_t port() const { return port_; }
  // GET /status, with the admin key when the gateway has one (engine
  // addresses are shown only to its holder).
  Json status();
  Process& process() { return *proc_; }

 private:
  std::unique_ptr<Process> proc_;
  std::uint16_t port_ = 0;
  std::string admin_key_;
};

// A file an operator edits while pdgate runs (a config file, a policy
// script), alone in a fresh directory removed with it. Each write() goes
// to a temporary file renamed over it, as editors and config managers do,
// so pdgate never reads half of it, and moves the modification time on a
// second, so a poll that compares times sees every edit.
class EditedFile {
 public:
  EditedFile(const std::string& name, const std::string& text);
  ~EditedFile();
  EditedFile(const EditedFile&) = delete;
  EditedFile& operator=(const EditedFile&) = delete;
  void write(const std::string& text);
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
  int bumps_ = 0;
};

// Polls `pred` until it holds or `timeout` passes.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred())
      return true;
    struct timespec ts {
      0, 10'000'000
    };
    nanosleep(&ts, nullptr);
  }
  return pred();
}

// How long a test waits for what takes the gateway a moment to learn (an
// engine's KV events reaching its index, a feed subscribing): longer under
// the sanitizers, which slow every process down.
#ifdef PDGATE_SANITIZED
inline constexpr auto kLearnWait = std::chrono::seconds(30);
#else
inline constexpr auto kLearnWait = std::chrono::seconds(10);
#endif

// The value of the first sample of `name` on the gateway's /metrics whose
// labels contain `labels`; -1 when none.
double metric_sample(std::uint16_t port, const std::string& name, const std::string& labels);

// A prefill policy routing on the engines' KV events: the candidate whose
// engine holds most of the prompt exactly; with no exact data,
// round-robin (so a request lands on the engine caching it only half the
// time).
inline constexpr const char* kExactPrefixPolicy = R"(
return {
  pick = function(ctx, instances)
    local cached, total = pdgate.cached_tokens()
    local best, best_n = nil, 0
    for i, n in pairs(cached or {}) do
      if n > best_n then best, best_n = instances[i], n end
    end
    if best then return best end
    local turn = pdgate.kv_incr("turn:" .. ctx.stage) or 0
    return instances[turn % #instances + 1]
  end,
}
)";

// A TCP port on 127.0.0.1 that nothing listens on.
std::uint16_t closed_port();

// Whether this machine has IPv6 loopback (::1): containers may run with
// IPv6 off, and tests of IPv6 addresses skip there.
bool have_ipv6_loopback();

}  // namespace pdgate::test
