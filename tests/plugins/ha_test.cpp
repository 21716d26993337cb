// High availability end to end (issue 5, item 9): a real redis-server,
// pdgate-sim engines, two pdgate replicas sharing Redis, and HAProxy in
// front configured from examples/ha/haproxy.cfg.in, the example's own
// template. One replica is SIGKILLed under load: only the requests in
// flight on it fail, every request started after the kill succeeds on the
// other replica, and conversations started before the kill continue there
// with KV reuse.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "tests/integration/harness.hpp"
#include "tests/plugins/redis_server.hpp"

namespace pdgate::test {
namespace {

using namespace std::chrono_literals;

// The haproxy binary (posix_spawn needs a path), or "" when not installed.
std::string find_haproxy() {
  std::string path = getenv("PATH") ? getenv("PATH") : "";
  path += ":/usr/sbin:/usr/local/sbin";
  std::istringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = dir + "/haproxy";
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0)
      return candidate;
  }
  return {};
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (auto pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

// HAProxy running examples/ha/haproxy.cfg.in with the ports filled in.
class Haproxy {
 public:
  Haproxy(const std::string& binary, std::uint16_t gw1, std::uint16_t gw2) {
    std::ifstream in(source_dir() + "/examples/ha/haproxy.cfg.in");
    std::stringstream text;
    text << in.rdbuf();
    std::string cfg = text.str();
    if (cfg.empty())
      throw std::runtime_error("cannot read examples/ha/haproxy.cfg.in");
    port_ = closed_port();
    replace_all(cfg, "@FRONT_PORT@", std::to_string(port_));
    replace_all(cfg, "@GW1_PORT@", std::to_string(gw1));
    replace_all(cfg, "@GW2_PORT@", std::to_string(gw2));
    char tmpl[] = "/tmp/pdgate-ha-XXXXXX";
    if (!mkdtemp(tmpl))
      throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    std::ofstream(dir_ + "/haproxy.cfg") << cfg;
    proc_ = std::make_unique<Process>(
        "haproxy", std::vector<std::string>{binary, "-f", dir_ + "/haproxy.cfg", "-db"});
  }
  ~Haproxy() {
    proc_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::uint16_t port() const { return port_; }
  Process& process() { return *proc_; }

 private:
  std::uint16_t port_ = 0;
  std::string dir_;
  std::unique_ptr<Process> proc_;
};

Json chat(Json messages, int max_tokens, bool stream) {
  return {{"model", "sim-model"},
          {"messages", std::move(messages)},
          {"max_tokens", max_tokens},
          {"stream", stream}};
}

// A multi-turn conversation: X-Conversation-Id, the history resent.
struct Conversation {
  explicit Conversation(std::string i) : id(std::move(i)) {}
  std::string id;
  Json messages = Json::array();
  int turns = 0;
  std::string last_request_id;  // of the last turn that succeeded
  std::string last_replica;     // which replica answered it
};

struct Turn {
  int status = 0;
  std::string replica;
  std::string request_id;
};

Turn send_turn(std::uint16_t port, Conversation& c) {
  ++c.turns;
  Json messages = c.messages;
  messages.push_back({{"role", "user"}, {"content", "Turn " + std::to_string(c.turns) + "?"}});
  Turn t;
  t.request_id = c.id + "-t" + std::to_string(c.turns);
  const auto r = post_json(port, "/v1/chat/completions", chat(messages, 4, false),
                           {{"X-Conversation-Id", c.id},
                            {"X-Request-Id", t.request_id},
                            {"Authorization", "Bearer ha-client"}});
  t.status = r.status;
  t.replica = r.header("x-pdgate-replica");
  if (r.status == 200) {
    messages.push_back(
        {{"role", "assistant"},
         {"content", r.json()["choices"][0]["message"].value("content", std::string())}});
    c.messages = std::move(messages);
    c.last_request_id = t.request_id;
    c.last_replica = t.replica;
  }
  return t;
}

// The prefill engine's record of the request with this X-Request-Id.
Json prefill_record(Sim& p, const std::string& request_id) {
  for (auto& r : p.requests()) {
    if (r.value("x_request_id", Json()) == request_id)
      return r;
  }
  return Json();
}

long metric(std::uint16_t port, const std::string& name) {
  std::istringstream in(get(port, "/metrics").body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0)
      return std::stol(line.substr(name.size() + 1));
  }
  return -1;
}

// A long stream opened through HAProxy before the kill.
struct Stream {
  std::unique_ptr<Connection> conn;
  std::string replica;
  bool completed = false;
};

// One request of the background load.
struct Sample {
  Clock::time_point start, end;
  int status = 0;  // 0: the connection failed or was cut
  std::string replica;
};

TEST(HighAvailability, KillOneReplicaUnderLoad) {
  const std::string haproxy = find_haproxy();
  if (haproxy.empty())
    GTEST_SKIP() << "haproxy is not installed (apt-get install haproxy, or "
                    "scripts/install-deps.sh); the HA test needs it";
  RedisServer redis;
  Sim p("prefill");
  // 20 ms per token: a 150-token stream lasts 3 s, a 4-token turn 80 ms.
  Sim d("decode", {"--issue-decode-kv", "--itl-ms", "20"});
  const std::vector<std::string> args = {"--model",  "sim-model",  "--prefill", p.hostport(),
                                         "--decode", d.hostport(), "--redis",   redis.url()};
  Gateway gw1(args), gw2(args);
  for (auto* g : {&gw1, &gw2}) {
    ASSERT_TRUE(eventually([&] {
      return get(g->port(), "/health").json()["conversation_store"]["reachable"] == true;
    }));
  }
  Haproxy lb(haproxy, gw1.port(), gw2.port());
  const auto front = lb.port();
  ASSERT_TRUE(eventually(
      [&] {
        try {
          return get(front, "/health").status == 200;
        } catch (const std::exception&) {
          return false;
        }
      },
      10s))
      << lb.process().log();

  // Conversations: two turns each, concurrently, so they spread over both
  // replicas.
  std::vector<Conversation> convs;
  for (int i = 0; i < 4; ++i)
    convs.emplace_back("ha-conv-" + std::to_string(i));
  for (int turn = 0; turn < 2; ++turn) {
    std::vector<std::thread> threads;
    std::vector<Turn> results(convs.size());
    for (std::size_t i = 0; i < convs.size(); ++i)
      threads.emplace_back([&, i] { results[i] = send_turn(front, convs[i]); });
    for (auto& t : threads)
      t.join();
    for (const auto& r : results)
      ASSERT_EQ(r.status, 200) << r.request_id;
  }
  int via_gw1 = 0;
  for (const auto& c : convs)
    via_gw1 += c.last_replica == "gw1";
  ASSERT_GT(via_gw1, 0) << "no conversation's last turn went through gw1 before the kill";

  // Long streams, alternating over the replicas (leastconn).
  std::vector<Stream> streams(8);
  for (std::size_t i = 0; i < streams.size(); ++i) {
    auto& s = streams[i];
    s.conn = std::make_unique<Connection>(front);
    s.conn->send_request(
        "POST", "/v1/chat/completions",
        chat({{{"role", "user"}, {"content", "long " + std::to_string(i)}}}, 150, true).dump(),
        {{"Content-Type", "application/json"}});
    const auto head = s.conn->read_head();
    ASSERT_EQ(head.status, 200);
    s.replica = head.header("x-pdgate-replica");
    ASSERT_FALSE(s.conn->read_body_some().empty());  // tokens are flowing
  }
  std::map<std::string, int> streams_on;
  for (const auto& s : streams)
    ++streams_on[s.replica];
  ASSERT_GT(streams_on["gw1"], 0);
  ASSERT_GT(streams_on["gw2"], 0);

  // Background load: short streaming requests from three clients.
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<Sample> samples;
  std::vector<std::thread> load;
  for (int c = 0; c < 3; ++c) {
    load.emplace_back([&, c] {
      for (int n = 0; !stop; ++n) {
        Sample s;
        s.start = Clock::now();
        try {
          Connection conn(front);
          conn.send_request(
              "POST", "/v1/chat/completions",
              chat({{{"role", "user"}, {"content", "load " + std::to_string(c * 10000 + n)}}}, 6,
                   true)
                  .dump(),
              {{"Content-Type", "application/json"}});
          // The head first: a stream cut afterwards still says where it ran.
          const auto head = conn.read_head();
          s.replica = head.header("x-pdgate-replica");
          std::string body;
          for (std::string piece; !(piece = conn.read_body_some()).empty();)
            body += piece;
          const auto data = sse_data(body);
          s.status = head.status != 200                         ? head.status
                     : !data.empty() && data.back() == "[DONE]" ? 200
                                                                : 0;
        } catch (const std::exception&) {
          s.status = 0;
        }
        s.end = Clock::now();
        std::lock_guard lock(mu);
        samples.push_back(s);
      }
    });
  }
  std::this_thread::sleep_for(500ms);
  const auto h_before = metric(gw2.port(), "pdgate_conversation_cache_hits_total");
  const auto kill_sent = Clock::now();
  gw1.process().signal(SIGKILL);
  gw1.process().wait();
  const auto killed = Clock::now();  // gw1 is gone: its sockets are closed

  // Conversations continue on the survivor, reading the blocks of their
  // last turn (stored in Redis, whichever replica served it).
  for (auto& c : convs) {
    const std::string previous = c.last_request_id;
    const auto t = send_turn(front, c);
    ASSERT_EQ(t.status, 200) << t.request_id;
    EXPECT_EQ(t.replica, "gw2");
    const Json rec = prefill_record(p, t.request_id);
    ASSERT_TRUE(rec.is_object()) << "no prefill record for " << t.request_id;
    EXPECT_EQ(rec["kv_result"], "valid") << t.request_id;
    const Json kv = Json::parse(rec["body"].get<std::string>())["kv_transfer_params"];
    EXPECT_EQ(kv.value("remote_request_id", "").rfind("cmpl-" + previous + "-0-", 0), 0u)
        << t.request_id << " got " << kv.dump();
  }
  EXPECT_EQ(metric(gw2.port(), "pdgate_conversation_cache_hits_total") - h_before,
            static_cast<long>(convs.size()));

  // The long streams: those on the killed replica are cut, those on the
  // survivor complete.
  for (auto& s : streams) {
    std::string body;
    try {
      for (std::string piece; !(piece = s.conn->read_body_some(10s)).empty();)
        body += piece;
      const auto data = sse_data(body);
      s.completed = !data.empty() && data.back() == "[DONE]";
    } catch (const std::exception&) {
      s.completed = false;
    }
    EXPECT_EQ(s.completed, s.replica == "gw2") << s.replica << ": " << body.size() << " bytes";
  }

  // Keep the load on past HAProxy's health check window (fall 2 x 500 ms).
  std::this_thread::sleep_for(1500ms);
  stop = true;
  for (auto& t : load)
    t.join();
  int after = 0, failed_before = 0;
  for (const auto& s : samples) {
    if (s.start > killed) {
      ++after;
      EXPECT_EQ(s.status, 200) << "a request started after the kill failed";
      EXPECT_EQ(s.replica, "gw2");
    } else if (s.status != 200) {
      // Only requests in flight at the kill may fail, and only on gw1.
      EXPECT_GT(s.end, kill_sent)
          << "a request failed "
          << std::chrono::duration_cast<std::chrono::milliseconds>(kill_sent - s.end).count()
          << " ms before the kill";
      EXPECT_NE(s.replica, "gw2");
      ++failed_before;
    }
  }
  EXPECT_GT(after, 10);
  RecordProperty("load_requests", static_cast<int>(samples.size()));
  RecordProperty("load_failed_in_flight", failed_before);
  RecordProperty("streams_cut", streams_on["gw1"]);
  std::printf(
      "load: %zu requests, %d after the kill, %d in flight on gw1 failed; streams cut: %d\n",
      samples.size(), after, failed_before, streams_on["gw1"]);
}

}  // namespace
}  // namespace pdgate::test
