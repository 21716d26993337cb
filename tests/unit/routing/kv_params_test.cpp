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

// Push: decode gets prefill's coordinates byte for byte and no block ids
// (vLLM's toy_push_proxy_server.py).
TEST(NixlPush, DecodeParamsKeepCoordinatesOnly) {
  const std::string answer =
      R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2]],)"
      R"("remote_engine_id":"eng-p","remote_request_id":"cmpl-r-0-ab","remote_host":"10.0.0.5",)"
      R"("remote_port":5600,"tp_size":2,"pp_size":1,"transfer_mode":"push"})";
  EXPECT_TRUE(answers_push(answer));
  const auto p = nixl_push_decode_params(answer);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(json::parse(*p), json::parse(R"({"do_remote_prefill":true,"do_remote_decode":false,)"
                                         R"("remote_engine_id":"eng-p","remote_request_id":)"
                                         R"("cmpl-r-0-ab","remote_host":"10.0.0.5",)"
                                         R"("remote_port":5600,"tp_size":2})"));
}

TEST(NixlPush, MissingOrNullFieldFailsNamingIt) {
  const auto p = nixl_push_decode_params(
      R"({"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":1,)"
      R"("tp_size":null})");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().find("tp_size"), std::string::npos) << p.error();
  EXPECT_FALSE(nixl_push_decode_params("[1]").ok());
  EXPECT_FALSE(answers_push(R"({"transfer_mode":"pull"})"));
  EXPECT_FALSE(answers_push(R"({})"));
  EXPECT_FALSE(answers_push("not json"));
}

TEST(Mooncake, LegParams) {
  EXPECT_EQ(json::parse(mooncake_prefill_params("xfer-1")),
            json::parse(R"({"do_remote_decode":true,"do_remote_prefill":false,)"
                        R"("transfer_id":"xfer-1"})"));
  EXPECT_EQ(json::parse(mooncake_decode_params("xfer-1", "http://10.0.0.1:8998", "eng\"x")),
            json::parse(R"({"do_remote_decode":false,"do_remote_prefill":true,)"
                        R"("transfer_id":"xfer-1","remote_bootstrap_addr":)"
                        R"("http://10.0.0.1:8998","remote_engine_id":"eng\"x"})"));
}

// The bootstrap server's answer is hostile input: only well-formed ranks
// and ids pass.
TEST(Mooncake, QueryAnswerValidated) {
  const auto ok =
      parse_mooncake_query(R"({"1":{"engine_id":"e1","tp_size":1},"0":{"engine_id":"e0"}})");
  ASSERT_TRUE(ok.ok()) << ok.error();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].rank, 0u);
  EXPECT_EQ((*ok)[0].engine_id, "e0");
  EXPECT_EQ((*ok)[1].engine_id, "e1");
  for (const char* bad :
       {"{}", "[]", R"({"x":{"engine_id":"e"}})", R"({"0":{"engine_id":""}})",
        R"({"0":{"engine_id":7}})", R"({"0":"e"})", R"({"99999":{"engine_id":"e"}})",
        R"({"0":{"engine_id":"a"},"0":{"engine_id":"b"}})", R"({"-1":{"engine_id":"e"}})",
        R"({"0":{"engine_id":"a\u0001b"}})"}) {
    EXPECT_FALSE(parse_mooncake_query(bad).ok()) << bad;
  }
  EXPECT_FALSE(
      parse_mooncake_query(R"({"0":{"engine_id":")" + std::string(300, 'a') + "\"}}").ok());
}

}  // namespace
}  // namespace pdgate
