// The access log: its line formats, the traceparent's trace id, and the
// bounded queue that drops (and counts) rather than blocks.
#include "core/gateway/access_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/upstream/instance.hpp"

namespace pdgate {
namespace {

std::shared_ptr<const Instance> instance(Role role, const std::string& url) {
  UpstreamSpec spec;
  spec.role = role;
  spec.url = url;
  return std::make_shared<Instance>(1, spec);
}

RequestRecord sample_record() {
  RequestRecord r;
  r.received_wall = std::chrono::system_clock::time_point(std::chrono::milliseconds(1764016863123));
  r.method = "POST";
  r.route = "/v1/chat/completions";
  r.request_id = "req-1";
  r.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  r.model = "m";
  r.stream = true;
  r.status = 200;
  r.stage = "decode";
  r.prefill = instance(Role::prefill, "http://p:8100");
  r.decode = instance(Role::decode, "http://d:8200");
  r.ttft = std::chrono::microseconds(412345);
  r.total = std::chrono::microseconds(1034000);
  r.bytes_sent = 5321;
  r.usage = TokenUsage{12, 100};
  r.retries = 1;
  r.conversation = "hit";
  r.policies = {"round_robin",  "least_load",   "conversation_decode",
                "0123456789ab", "1a2b3c4d5e6f", "abcdef012345"};
  r.tenant = "acme";
  r.path = "pd";
  return r;
}

// JSON lines carry every field, typed, with the policies of the stages
// that ran; unknown values are null.
TEST(AccessLogFormat, JsonLine) {
  const std::string line = format_access_line(sample_record(), AccessLogFormat::json);
  ASSERT_EQ(line.back(), '\n');
  ASSERT_EQ(line.find('\n'), line.size() - 1);
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["time"], "2025-11-24T20:41:03.123Z");
  EXPECT_EQ(j["request_id"], "req-1");
  EXPECT_EQ(j["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(j["route"], "/v1/chat/completions");
  EXPECT_EQ(j["status"], 200);
  EXPECT_EQ(j["stage"], "decode");
  EXPECT_EQ(j["prefill"], "http://p:8100");
  EXPECT_EQ(j["decode"], "http://d:8200");
  EXPECT_TRUE(j["encode"].empty());
  EXPECT_DOUBLE_EQ(j["ttft_ms"].get<double>(), 412.345);
  EXPECT_DOUBLE_EQ(j["total_ms"].get<double>(), 1034.0);
  EXPECT_EQ(j["bytes_sent"], 5321);
  EXPECT_EQ(j["prompt_tokens"], 12);
  EXPECT_EQ(j["completion_tokens"], 100);
  EXPECT_EQ(j["retries"], 1);
  EXPECT_EQ(j["conversation"], "hit");
  EXPECT_EQ(j["policy"],
            (nlohmann::json{{"prefill", "least_load"}, {"decode", "conversation_decode"}}));
  EXPECT_EQ(j["policy_version"],
            (nlohmann::json{{"prefill", "1a2b3c4d5e6f"}, {"decode", "abcdef012345"}}));
  EXPECT_TRUE(j["reject"].is_null());
  EXPECT_EQ(j["tenant"], "acme");
  EXPECT_EQ(j["path"], "pd");
  // A client's model name with quotes, a newline and invalid UTF-8 still
  // gives one valid JSON line.
  RequestRecord hostile = sample_record();
  hostile.model = "a\"b\nc\xff";
  const std::string h = format_access_line(hostile, AccessLogFormat::json);
  ASSERT_EQ(h.find('\n'), h.size() - 1) << h;
  EXPECT_EQ(nlohmann::json::parse(h)["model"], "a\"b\nc\xef\xbf\xbd");
  RequestRecord empty;
  empty.status = 503;
  const auto e = nlohmann::json::parse(format_access_line(empty, AccessLogFormat::json));
  EXPECT_TRUE(e["ttft_ms"].is_null());
  EXPECT_TRUE(e["prompt_tokens"].is_null());
  EXPECT_TRUE(e["decode"].is_null());
  EXPECT_TRUE(e["conversation"].is_null());
}

// Text lines are key=value; a client-chosen value with spaces, quotes or a
// newline is quoted, so it cannot forge a field or a second line.
TEST(AccessLogFormat, TextLineQuotesHostileValues) {
  RequestRecord r = sample_record();
  std::string line = format_access_line(r, AccessLogFormat::text);
  EXPECT_EQ(line.rfind("2025-11-24T20:41:03.123Z request_id=req-1 ", 0), 0u) << line;
  for (const char* f :
       {" status=200 ", " decode=http://d:8200 ", " ttft_ms=412.345 ", " prompt_tokens=12 ",
        " completion_tokens=100 ", " retries=1 ", " conversation=hit ",
        " policy=prefill:least_load,decode:conversation_decode ",
        " policy_version=prefill:1a2b3c4d5e6f,decode:abcdef012345 ",
        " reject=- tenant=acme path=pd\n", " encode=- "}) {
    EXPECT_NE(line.find(f), std::string::npos) << f << " in " << line;
  }
  r.model = "evil\nstatus=200 x";
  line = format_access_line(r, AccessLogFormat::text);
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;
  EXPECT_NE(line.find(R"( model="evil\nstatus=200 x" )"), std::string::npos) << line;
}

// The trace id of a valid traceparent; anything else gives none.
TEST(AccessLogFormat, TraceIdOfTraceparent) {
  EXPECT_EQ(trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(trace_id_of("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"),
            "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(trace_id_of("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), "");
  EXPECT_EQ(trace_id_of("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"), "");
  EXPECT_EQ(trace_id_of("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), "");
  EXPECT_EQ(trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"), "");
  EXPECT_EQ(trace_id_of("garbage"), "");
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string(name) + "-" + std::to_string(::getpid())))
      .string();
}

// Every submitted record becomes one line of the file, and the lines are
// there once the log is closed.
TEST(AccessLogWriter, OneLinePerRecord) {
  const std::string path = temp_path("pdgate-access-log-test");
  std::filesystem::remove(path);
  {
    auto log = AccessLog::open(path, AccessLogFormat::json);
    ASSERT_TRUE(log) << log.error();
    for (int i = 0; i < 1000; ++i) {
      RequestRecord r = sample_record();
      r.request_id = "req-" + std::to_string(i);
      (*log)->submit(std::move(r));
    }
    EXPECT_EQ((*log)->dropped(), 0u);
  }
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line); ++n)
    EXPECT_EQ(nlohmann::json::parse(line)["request_id"], "req-" + std::to_string(n));
  EXPECT_EQ(n, 1000);
  std::filesystem::remove(path);
}

// A log whose output is stuck (a pipe nobody reads) never blocks submit:
// past the queue's capacity records are dropped and counted.
TEST(AccessLogWriter, StuckOutputDropsInsteadOfBlocking) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string target = "/proc/self/fd/" + std::to_string(fds[1]);
  auto log = AccessLog::open(target, AccessLogFormat::text, 64);
  ASSERT_TRUE(log) << log.error();
  ::close(fds[1]);
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 20000; ++i)
    (*log)->submit(sample_record());
  // 20,000 submits into a pipe that holds ~64 KiB (~150 lines).
  EXPECT_GT((*log)->dropped(), 10000u);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  // Drain the pipe so that the writer can finish and close it.
  std::thread reader([fd = fds[0]] {
    char buf[65536];
    while (::read(fd, buf, sizeof buf) > 0) {
    }
  });
  log->reset();
  reader.join();
  ::close(fds[0]);
}

// A file that cannot be opened is an error naming it.
TEST(AccessLogWriter, UnopenableFileIsAnError) {
  auto log = AccessLog::open("/nonexistent-dir/x.log", AccessLogFormat::text);
  ASSERT_FALSE(log);
  EXPECT_NE(log.error().find("/nonexistent-dir/x.log"), std::string::npos) << log.error();
}

}  // namespace
}  // namespace pdgate
