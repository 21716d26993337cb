// The request hook's header edits applied to what every engine request
// carries (core/pipeline/request_hook_phase.cpp).
#include <gtest/gtest.h>

#include "core/pipeline/forwarded_headers.hpp"
#include "core/pipeline/request_hook_phase.hpp"

namespace pdgate {
namespace {

// A set replaces a forwarded or configured header of the same name (any
// case) and is sent once; a removal drops it; an edit pdgate refuses
// (here Host) is skipped even if it got this far.
TEST(ApplyHeaderEdits, SetReplaceRemove) {
  ForwardedHeaders fwd;
  fwd.extra = {{"X-Configured", "yes"}, {"X-Session", "s1"}, {"X-Keep", "k"}};
  apply_header_edits(fwd, {{"x-session", std::string("s2")},
                           {"x-configured", std::nullopt},
                           {"x-new", std::string("n")},
                           {"host", std::string("evil")},
                           {"x-new", std::string("n2")}});
  ASSERT_EQ(fwd.extra.size(), 1u);
  EXPECT_EQ(fwd.extra[0].first, "X-Keep");
  const std::vector<std::pair<std::string, std::string>> want = {{"x-session", "s2"},
                                                                 {"x-new", "n2"}};
  EXPECT_EQ(fwd.policy_set, want);
}

}  // namespace
}  // namespace pdgate
