// The test harness itself: what it promises every integration test.
#include "tests/integration/harness.hpp"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace pdgate::test
