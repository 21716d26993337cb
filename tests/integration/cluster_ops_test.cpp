// The aggregated GET /health and the profiler fan-out (POST /start_profile,
// /stop_profile) through pdgate to pdgate-sim instances of every role.
#include <gtest/gtest.h>

#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

std::int64_t profile_calls(Sim& s, const char* action) {
  return s.stats()["profile_total"][action].get<std::int64_t>();
}

// Every role with a live instance: 200, each cluster "healthy", the
// conversation store's state still reported.
TEST(Health, AllRolesHealthy) {
  Sim e("encode"), p("prefill"), d("decode");
  Gateway gw({"--encode-servers-urls", e.url(), "--prefill-servers-urls", p.url(),
              "--decode-servers-urls", d.url()});
  auto r = get(gw.port(), "/health");
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = r.json();
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["encode_cluster"], "healthy");
  EXPECT_EQ(j["prefill_cluster"], "healthy");
  EXPECT_EQ(j["decode_cluster"], "healthy");
  EXPECT_EQ(j["instances"].size(), 3u);
  EXPECT_TRUE(j.contains("conversation_store"));
}

// A role with no instances configured is "empty" and does not fail /health
// (E -> PD without encoders here: prefill disabled, no encoders).
TEST(Health, UnconfiguredRolesAreEmpty) {
  Sim pd("both");
  Gateway gw({"--prefill-servers-urls", "disable", "--decode-servers-urls", pd.url()});
  auto r = get(gw.port(), "/health");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["encode_cluster"], "empty");
  EXPECT_EQ(r.json()["prefill_cluster"], "empty");
  EXPECT_EQ(r.json()["decode_cluster"], "healthy");
}

// One of two decodes down: the role stays healthy. The only encoder
// refusing connections and the only prefill hanging: once the health
// checks have judged them, both roles are unhealthy and /health is 503
// (answered at once, from the checks' state).
TEST(Health, RoleWithoutHealthyInstanceIs503) {
  Sim hung("prefill", {"--hang"}), d("decode");
  Gateway gw({"--encode-servers-urls", "http://127.0.0.1:" + std::to_string(closed_port()),
              "--prefill-servers-urls", hung.url(), "--decode-servers-urls",
              d.url() + ",http://127.0.0.1:" + std::to_string(closed_port()), "--health-interval",
              "200ms", "--health-fall", "1"});
  ASSERT_TRUE(eventually(
      [&] {
        auto h = get(gw.port(), "/health");
        return h.status == 503 && h.json()["prefill_cluster"] == "unhealthy";
      },
      std::chrono::seconds(4)));
  const auto start = Clock::now();
  auto r = get(gw.port(), "/health");
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
  ASSERT_EQ(r.status, 503) << r.body;
  auto j = r.json();
  EXPECT_EQ(j["status"], "unhealthy");
  EXPECT_EQ(j["encode_cluster"], "unhealthy");
  EXPECT_EQ(j["prefill_cluster"], "unhealthy");
  EXPECT_EQ(j["decode_cluster"], "healthy");
}

// start/stop go to every instance of every role; the answer lists each.
TEST(Profile, FansOutToEveryInstance) {
  Sim e("encode"), p("prefill"), d1("decode"), d2("decode");
  Gateway gw({"--encode-servers-urls", e.url(), "--prefill-servers-urls", p.url(),
              "--decode-servers-urls", d1.url() + "," + d2.url()});
  for (const char* action : {"start", "stop"}) {
    auto r = http_request(gw.port(), "POST", std::string("/") + action + "_profile", "{}",
                          {{"Content-Type", "application/json"}});
    ASSERT_EQ(r.status, 200) << r.body;
    auto j = r.json();
    EXPECT_EQ(j["encode"].size(), 1u);
    EXPECT_EQ(j["prefill"].size(), 1u);
    EXPECT_EQ(j["decode"].size(), 2u);
    for (auto* s : {&e, &p, &d1, &d2})
      EXPECT_EQ(profile_calls(*s, action), 1) << action;
  }
}

// Instances without a profiler (404) are tolerated while one has it.
TEST(Profile, NotFoundIsTolerated) {
  Sim e("encode", {"--no-profile"}), p("prefill", {"--no-profile"}), d("decode");
  Gateway gw({"--encode-servers-urls", e.url(), "--prefill-servers-urls", p.url(),
              "--decode-servers-urls", d.url()});
  auto r = http_request(gw.port(), "POST", "/start_profile", "", {});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["encode"][0]["status"], 404);
  EXPECT_EQ(profile_calls(d, "start"), 1);
}

// Every instance answering 404: 503 with an OpenAI-style error.
TEST(Profile, AllNotFoundIs503) {
  Sim p("prefill", {"--no-profile"}), d("decode", {"--no-profile"});
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  auto r = http_request(gw.port(), "POST", "/stop_profile", "{}",
                        {{"Content-Type", "application/json"}});
  ASSERT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("disabled"), std::string::npos);
}

}  // namespace
}  // namespace pdgate::test
