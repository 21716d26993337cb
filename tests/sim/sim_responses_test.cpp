#include <gtest/gtest.h>

#include "sim/metrics.hpp"
#include "sim/request_log.hpp"
#include "sim/responses.hpp"

namespace pdgate::sim {
namespace {

using nlohmann::json;

json roundtrip(const ojson& j) {
  return json::parse(j.dump());
}

// A non-streaming completion has vLLM's fields, usage sums and null kv params.
TEST(SimResponses, CompletionBody) {
  ResponseMeta m{"cmpl-abc", "sim-model", 1700000000, false};
  json j = roundtrip(make_response(m, " the quick", "length", Usage{10, 2}, nullptr));
  EXPECT_EQ(j["id"], "cmpl-abc");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "sim-model");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], " the quick");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0].contains("stop_reason"));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["total_tokens"], 12);
  EXPECT_TRUE(j["usage"].contains("prompt_tokens_details"));
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"].is_null());
  ASSERT_TRUE(j.contains("kv_transfer_params"));
  EXPECT_TRUE(j["kv_transfer_params"].is_null());
}

// A chat body carries an assistant message and the kv params object when given.
TEST(SimResponses, ChatBodyWithKvParams) {
  ResponseMeta m{"chatcmpl-abc", "sim-model", 1, true};
  ojson kv = make_kv_params({1, 2}, "eng", "cmpl-r-0-deadbeef", "10.0.0.5", 5600);
  json j = roundtrip(make_response(m, " the", "length", Usage{3, 1}, kv));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], " the");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["kv_transfer_params"]["remote_engine_id"], "eng");
}

// kv params have the NIXL shape: nested block ids, host/port, tp_size.
TEST(SimResponses, KvParamsShape) {
  json kv = roundtrip(make_kv_params({7, 8, 9}, "eng-1", "cmpl-x-0-0123abcd", "h", 8100));
  EXPECT_EQ(kv["do_remote_prefill"], true);
  EXPECT_EQ(kv["do_remote_decode"], false);
  EXPECT_EQ(kv["remote_block_ids"], json::parse("[[7,8,9]]"));
  EXPECT_EQ(kv["remote_engine_id"], "eng-1");
  EXPECT_EQ(kv["remote_request_id"], "cmpl-x-0-0123abcd");
  EXPECT_EQ(kv["remote_host"], "h");
  EXPECT_EQ(kv["remote_port"], 8100);
  EXPECT_EQ(kv["tp_size"], 1);
}

// Streaming chunks: chat role delta first, token deltas, finish on the last, usage chunk with no
// choices.
TEST(SimResponses, StreamChunks) {
  ResponseMeta chat{"chatcmpl-1", "m", 1, true};
  json role = roundtrip(make_role_chunk(chat));
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"], json::parse(R"({"role":"assistant","content":""})"));
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());

  json tok = roundtrip(make_token_chunk(chat, " the", ""));
  EXPECT_EQ(tok["choices"][0]["delta"]["content"], " the");
  EXPECT_TRUE(tok["choices"][0]["finish_reason"].is_null());
  json fin = roundtrip(make_token_chunk(chat, " dog", "length"));
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");

  ResponseMeta cmpl{"cmpl-1", "m", 1, false};
  json ct = roundtrip(make_token_chunk(cmpl, " the", ""));
  EXPECT_EQ(ct["object"], "text_completion");
  EXPECT_EQ(ct["choices"][0]["text"], " the");

  json usage = roundtrip(make_usage_chunk(cmpl, Usage{5, 3}));
  EXPECT_TRUE(usage["choices"].is_array());
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 8);
}

// SSE framing is "data: <json>\n\n" and the stream ends with [DONE].
TEST(SimResponses, SseFraming) {
  ojson j = {{"a", 1}};
  EXPECT_EQ(sse_event(j), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

// Errors use vLLM's nested shape with the type derived from the status.
TEST(SimResponses, ErrorShape) {
  json e = roundtrip(make_error("nope", 404));
  EXPECT_EQ(e["error"]["message"], "nope");
  EXPECT_EQ(e["error"]["type"], "NotFoundError");
  EXPECT_TRUE(e["error"]["param"].is_null());
  EXPECT_EQ(e["error"]["code"], 404);
  EXPECT_EQ(roundtrip(make_error("x", 400))["error"]["type"], "BadRequestError");
  EXPECT_EQ(roundtrip(make_error("x", 500))["error"]["type"], "InternalServerError");
}

// The model list carries the model id and max_model_len.
TEST(SimResponses, ModelList) {
  json j = roundtrip(make_models("sim-model", 4096, 1, "modelperm-1"));
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "sim-model");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 4096);
}

// Prometheus text has vLLM's names with engine/model labels and the sim counters.
TEST(SimMetrics, PrometheusText) {
  Counters c;
  c.prefix_cache_queries = 100;
  c.prefix_cache_hits = 32;
  c.count_kv(KvResult::valid);
  c.count_kv(KvResult::reused);
  c.requests_by_path["/v1/completions"] = 2;
  Gauges g;
  g.running = 3;
  g.waiting = 1;
  g.kv_cache_usage = 0.5;
  const std::string t = render_prometheus(c, g, "sim-model");
  const std::string l = "{engine=\"0\",model_name=\"sim-model\"}";
  EXPECT_NE(t.find("vllm:num_requests_running" + l + " 3.0\n"), std::string::npos) << t;
  EXPECT_NE(t.find("vllm:num_requests_waiting" + l + " 1.0\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:kv_cache_usage_perc" + l + " 0.5\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:prefix_cache_queries_total" + l + " 100.0\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:prefix_cache_hits_total" + l + " 32.0\n"), std::string::npos);
  EXPECT_NE(t.find("sim:kv_params_total{result=\"valid\"} 1.0\n"), std::string::npos);
  EXPECT_NE(t.find("sim:kv_params_total{result=\"reused\"} 1.0\n"), std::string::npos);
  EXPECT_NE(t.find("sim:requests_total{path=\"/v1/completions\"} 2.0\n"), std::string::npos);
  EXPECT_NE(t.find("sim:profile_total{action=\"start\"} 0.0\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE vllm:prefix_cache_hits_total counter\n"), std::string::npos);
}

// /sim/stats JSON exposes the kv results by name.
TEST(SimMetrics, StatsJson) {
  Counters c;
  c.count_kv(KvResult::valid);
  Gauges g;
  g.open_connections = 2;
  json s = json::parse(stats_json(c, g).dump());
  EXPECT_EQ(s["kv_params_total"]["valid"], 1);
  EXPECT_EQ(s["kv_params_total"]["reused"], 0);
  EXPECT_EQ(s["open_connections"], 2);
  EXPECT_TRUE(s.contains("issued_kv_outstanding"));
}

// The request ring keeps the newest records, numbers them and renders nulls for unset times.
TEST(SimRequestLog, RingAndJson) {
  RequestLog log(2);
  for (int i = 0; i < 3; ++i) {
    RequestRecord r;
    r.method = "POST";
    r.path = "/v1/completions";
    r.headers = {{"x-request-id", "r" + std::to_string(i)}, {"accept", "a"}, {"accept", "b"}};
    r.body = "{}";
    log.add(std::move(r));
  }
  json a = json::parse(log.to_json().dump());
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0]["seq"], 2);
  EXPECT_EQ(a[1]["seq"], 3);
  EXPECT_EQ(a[1]["headers"]["x-request-id"], "r2");
  EXPECT_EQ(a[1]["headers"]["accept"], "a, b");
  EXPECT_EQ(a[1]["outcome"], "in_progress");
  EXPECT_EQ(a[1]["kv_result"], "none");
  EXPECT_TRUE(a[1]["first_byte_at_ms"].is_null());
  EXPECT_TRUE(a[1]["x_request_id"].is_null());
  log.clear();
  EXPECT_EQ(log.size(), 0u);
}

// The ring also drops the oldest records once their bodies exceed the byte budget.
TEST(SimRequestLog, ByteBudget) {
  RequestLog log(100, 10);
  for (int i = 0; i < 3; ++i) {
    RequestRecord r;
    r.body = std::string(4, 'x');
    log.add(std::move(r));
  }
  EXPECT_EQ(log.size(), 2u);
}

}  // namespace
}  // namespace pdgate::sim
