// What an operator sees of a policy through a real gateway: its own log
// level (--policy-log-level), and the access log naming the policy and
// the version that routed each request.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "tests/integration/admin_gateway.hpp"
#include "tests/integration/harness.hpp"
#include "tests/policies/policy_gateway_util.hpp"

namespace pdgate::test {
namespace {

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

// At --log-level info, `chatty=debug` shows that policy's debug lines and
// nobody else's: not the other policy's, not the gateway's own. The
// access log names each stage's policy by name and version, the versions
// /admin/config shows.
TEST(PolicyVisibility, OwnLogLevelAndAccessLogVersions) {
  Sim p("prefill"), d("decode");
  Script chatty(R"lua(
return {
  on_request = function(req) pdgate.log("debug", "hook saw " .. req.model) end,
  pick = function(ctx, instances)
    pdgate.log("debug", "chatty picks for " .. ctx.stage)
    pdgate.log("info", "chatty info line")
    return 1
  end,
}
)lua",
                "chatty.lua");
  Script quiet(R"lua(
return { pick = function(ctx, instances)
  pdgate.log("debug", "quiet debug line")
  pdgate.log("warn", "quiet warn line")
  return 1
end }
)lua",
               "quiet.lua");
  const std::string log =
      ::testing::TempDir() + "/visibility-" + std::to_string(::getpid()) + ".access.log";
  std::filesystem::remove(log);
  AdminGateway gw({"--model", "sim-model", "--workers", "1", "--log-level", "info",
                   "--policy-prefill", quiet.path(), "--policy-decode", chatty.path(),
                   "--policy-log-level", "chatty=debug", "--prefill", p.hostport(), "--decode",
                   d.hostport(), "--access-log", log});
  ASSERT_EQ(post_json(gw.port(), "/v1/chat/completions", user_chat("hello")).status, 200);
  ASSERT_TRUE(eventually([&] {
    return gw.gw->process().log().find("chatty info line") != std::string::npos &&
           read_text(log).find("policy_version=") != std::string::npos;
  }));
  const std::string err = gw.gw->process().log();
  EXPECT_EQ(count_of(err, "policy chatty: hook saw sim-model"), 1u) << err;
  EXPECT_EQ(count_of(err, "policy chatty: chatty picks for decode"), 1u) << err;
  EXPECT_EQ(count_of(err, "policy quiet: quiet warn line"), 1u) << err;
  EXPECT_EQ(count_of(err, "quiet debug line"), 0u) << err;
  // The only debug lines are the chatty policy's two.
  EXPECT_EQ(count_of(err, "[debug]"), 2u) << err;

  const Json stages = gw.call("GET", "/admin/config").json()["policies"]["stages"];
  const std::string line = read_text(log);
  EXPECT_NE(line.find(" policy=prefill:quiet,decode:chatty "), std::string::npos) << line;
  EXPECT_NE(line.find(" policy_version=prefill:" + stages["prefill"]["version"].get<std::string>() +
                      ",decode:" + stages["decode"]["version"].get<std::string>() + " "),
            std::string::npos)
      << line;
}

}  // namespace
}  // namespace pdgate::test
