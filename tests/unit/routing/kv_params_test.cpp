// The handshake's kv_transfer_params (core/routing/kv_params.hpp).
#include "core/routing/kv_params.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/unit/body_fixtures.hpp"

namespace pdgate {
namespace {

using nlohmann::json;
using test::kChat;
using test::kCompletions;
using test::kPrefillParams;
using test::must_index;
using test::parsed;

// Params in a prefill response come back as their exact raw text (nested block ids).
TEST(ExtractKvParams, ObjectByteIdentical) {
  const std::string resp = R"({"id":"cmpl-1","choices":[{"text":"a","kv_transfer_params":1}],)"
                           R"("kv_transfer_params":)" +
                           kPrefillParams + R"(,"usage":{"prompt_tokens":3}})";
  const auto r = extract_kv_params(resp);
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ(**r, kPrefillParams);
}

// Older engines' flat block id lists pass through untouched as well.
TEST(ExtractKvParams, FlatBlockIds) {
  const std::string params = R"({"do_remote_prefill":true,"remote_block_ids":[4, 5,6],)"
                             R"("remote_num_tokens":17,"remote_blocks_expiry_time":1.5e9})";
  const auto r = extract_kv_params(R"({"kv_transfer_params" :  )" + params + "\n}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->value(), params);
}

// null or absent params mean "no params"; invalid JSON and non-object params are errors.
TEST(ExtractKvParams, NullAbsentAndErrors) {
  auto r = extract_kv_params(R"({"kv_transfer_params":null})");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  r = extract_kv_params(R"({"choices":[]})");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_FALSE(extract_kv_params(R"({"kv_transfer_params":{)").ok());
  EXPECT_FALSE(extract_kv_params("").ok());
  EXPECT_FALSE(extract_kv_params(R"({"kv_transfer_params":[1]})").ok());
}

// --- Multi-turn helpers -----------------------------------------------------------

// Next-turn params point at the decode host and flip the direction flags; the rest stays
// byte-identical.
TEST(NextTurnParams, RewritesHostAndFlags) {
  const std::string decode_params =
      R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[7, 8]],)"
      R"("remote_engine_id":"d-uuid","remote_host":"0.0.0.0","remote_port":5601,"x":{"y":1}})";
  const auto r = kv_params_for_next_turn_prefill(decode_params, "10.0.0.2");
  ASSERT_TRUE(r.ok()) << r.error();
  const json j = parsed(*r);
  EXPECT_EQ(j["remote_host"], "10.0.0.2");
  EXPECT_EQ(j["do_remote_decode"], true);
  EXPECT_EQ(j["do_remote_prefill"], false);
  EXPECT_EQ(j["remote_port"], 5601);
  EXPECT_NE(r->find(R"("remote_block_ids":[[7, 8]])"), std::string::npos);
  EXPECT_NE(r->find(R"("x":{"y":1})"), std::string::npos);
}

// Missing flags and host are appended; a non-object is an error.
TEST(NextTurnParams, AppendsAndRejects) {
  const auto r = kv_params_for_next_turn_prefill(R"({"remote_block_ids":[1]})", "d\"host");
  ASSERT_TRUE(r.ok());
  const json j = parsed(*r);
  EXPECT_EQ(j["remote_host"], "d\"host");
  EXPECT_EQ(j["do_remote_decode"], true);
  EXPECT_EQ(j["do_remote_prefill"], false);
  EXPECT_FALSE(kv_params_for_next_turn_prefill("null", "h").ok());
  EXPECT_FALSE(kv_params_for_next_turn_prefill("[1]", "h").ok());
}

}  // namespace
}  // namespace pdgate
