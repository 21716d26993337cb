// The test harness itself: what it promises every integration test.
#include "tests/integration/harness.hpp"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <csignal>

#include <chrono>
#include <thread>

namespace pdgate::test {
namespace {

// A child process that printed a sanitizer report fails the test that
// started it, when the harness stops it (the ASan+UBSan run relies on it).
TEST(Harness, ChildSanitizerReportFailsTheTest) {
  EXPECT_NONFATAL_FAILURE(
      {
        Process child(
            "reporter",
            {"/bin/sh", "-c",
             "echo '==7==ERROR: LeakSanitizer: detected memory leaks' >&2; exec sleep 30"});
        for (int i = 0; i < 100 && child.log().empty(); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
      },
      "reporter printed a sanitizer report");
}

// A child that printed none passes.
TEST(Harness, QuietChildPasses) {
  Process child("quiet", {"/bin/sh", "-c", "echo 'all fine' >&2; exec sleep 30"});
  for (int i = 0; i < 100 && child.log().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(child.log(), "all fine\n");
}

// A sim stopped while it streams exits cleanly: under ASan the requests
// it still runs are torn down after its engine cores, which once read
// freed memory (the harness then fails whichever test stopped a busy sim).
TEST(SimShutdown, SigtermDuringAStreamExitsCleanly) {
  Sim s("decode", {"--itl-ms", "50"});
  Connection c(s.port());
  const Json body = {{"model", "sim-model"},
                     {"messages", {{{"role", "user"}, {"content", "hello"}}}},
                     {"max_tokens", 100},
                     {"stream", true}};
  c.send_request("POST", "/v1/chat/completions", body.dump(),
                 {{"Content-Type", "application/json"}});
  ASSERT_EQ(c.read_head().status, 200);
  EXPECT_FALSE(c.read_body_some().empty());
  s.process().signal(SIGTERM);
  const int st = s.process().wait(std::chrono::seconds(10));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << "\n" << s.process().log();
}

}  // namespace
}  // namespace pdgate::test
