// /v1/responses through prefill and decode, and vLLM's endpoints one
// engine answers alone (/tokenize, /v1/embeddings, /score, an audio
// upload, ...), forwarded in one hop: real pdgate and pdgate-sim
// processes, checked as a client and the engines see them (issue 28,
// item 7).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/base/sha256.hpp"
#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

const Headers kJson = {{"Content-Type", "application/json"}};

// The engine-side log of requests to `path`.
std::vector<Json> engine_requests(std::uint16_t port, const std::string& path) {
  std::vector<Json> out;
  for (auto& r : get(port, "/sim/requests").json()) {
    if (r.value("path", "") == path)
      out.push_back(r);
  }
  return out;
}

// The value of the pdgate_requests_total series for (route, status), or
// -1 when /metrics has none.
double requests_total(std::uint16_t port, const std::string& route, int status) {
  const std::string text = get(port, "/metrics").body;
  const std::string want_route = "route=\"" + route + "\"";
  const std::string want_status = "status=\"" + std::to_string(status) + "\"";
  double total = -1;
  std::size_t at = 0;
  while ((at = text.find("pdgate_requests_total{", at)) != std::string::npos) {
    const std::size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    at = end;
    if (line.find(want_route) == std::string::npos || line.find(want_status) == std::string::npos)
      continue;
    total = (total < 0 ? 0 : total) + std::stod(line.substr(line.rfind(' ') + 1));
  }
  return total;
}

// Whether pdgate_requests_total{route, status} comes to `n`: a request is
// counted once its answer is written, a moment after the client read it.
bool counted(std::uint16_t port, const std::string& route, int status, double n) {
  return eventually([&] { return requests_total(port, route, status) == n; });
}

// The SSE events of a body, raw (event and data lines together).
std::vector<std::string> raw_events(const std::string& body) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < body.size()) {
    const std::size_t end = body.find("\n\n", at);
    if (end == std::string::npos) {
      out.push_back(body.substr(at));
      break;
    }
    out.push_back(body.substr(at, end + 2 - at));
    at = end + 2;
  }
  return out;
}

Json responses_request(bool stream) {
  return {{"model", "sim-model"},
          {"instructions", "Answer briefly."},
          {"input", Json::array({{{"role", "user"},
                                  {"content", Json::array({{{"type", "input_text"},
                                                            {"text", "What is a KV cache?"}}})}}})},
          {"max_output_tokens", 5},
          {"stream", stream}};
}

// A streamed /v1/responses runs prefill with max_output_tokens 1 and no
// stream, hands its kv_transfer_params to decode, and relays decode's
// named events byte for byte: the client reads what decode wrote.
TEST(ResponsesApi, StreamedThroughPrefillAndDecode) {
  Sim p("prefill"), d("decode");
  // Params shown: the gateway has nothing to take out of the events (its
  // default hides decode's params, DecodeParamsInTheCompletedEventAreHidden).
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport(), "--expose-kv-params", "true"});
  const auto r =
      http_request(gw.port(), "POST", "/v1/responses", responses_request(true).dump(), kJson);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.header("content-type").find("text/event-stream"), std::string::npos);

  const auto pre = engine_requests(p.port(), "/v1/responses");
  ASSERT_EQ(pre.size(), 1u);
  const Json pb = Json::parse(pre[0]["body"].get<std::string>());
  EXPECT_EQ(pb["max_output_tokens"], 1) << pb.dump();
  EXPECT_FALSE(pb.contains("max_tokens")) << pb.dump();
  EXPECT_EQ(pb["stream"], false);
  EXPECT_EQ(pb["store"], false);
  EXPECT_EQ(pb["kv_transfer_params"]["do_remote_decode"], true);
  EXPECT_EQ(pb["input"], responses_request(true)["input"]);
  EXPECT_TRUE(pre[0]["kv_params_issued"].get<bool>());

  const auto dec = engine_requests(d.port(), "/v1/responses");
  ASSERT_EQ(dec.size(), 1u);
  const Json db = Json::parse(dec[0]["body"].get<std::string>());
  EXPECT_EQ(db["max_output_tokens"], 5);
  EXPECT_EQ(db["stream"], true);
  EXPECT_EQ(db["kv_transfer_params"]["do_remote_prefill"], true) << db.dump();
  EXPECT_EQ(db["kv_transfer_params"]["remote_engine_id"], p.stats()["engine_id"]);
  EXPECT_EQ(dec[0]["kv_result"], "valid") << dec[0].dump();
  EXPECT_EQ(dec[0]["x_request_id"], pre[0]["x_request_id"]);

  // The events, in vLLM's order, each `event: T` + `data: {"type": T}`.
  const auto events = raw_events(r.body);
  std::vector<std::string> types;
  for (const auto& e : events) {
    ASSERT_EQ(e.rfind("event: ", 0), 0u) << e;
    const std::string type = e.substr(7, e.find('\n') - 7);
    const auto data = sse_data(e);
    ASSERT_EQ(data.size(), 1u) << e;
    EXPECT_EQ(Json::parse(data[0])["type"], type);
    types.push_back(type);
  }
  const std::vector<std::string> want = {
      "response.created",           "response.in_progress",
      "response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done",
      "response.content_part.done", "response.output_item.done",
      "response.completed"};
  EXPECT_EQ(types, want) << r.body;
  // Byte for byte what decode wrote.
  EXPECT_EQ(r.body, dec[0]["stream_sent"].get<std::string>());
  const Json done = Json::parse(sse_data(events.back())[0]);
  EXPECT_EQ(done["response"]["status"], "completed");
  EXPECT_EQ(done["response"]["usage"]["output_tokens"], 5);
  // Decode's own record of what it sent: the client got exactly that.
  EXPECT_EQ(dec[0]["completion_tokens"], 5);
}

// The sum of a histogram's series, from /metrics text.
double metric_value(std::uint16_t port, const std::string& series) {
  const std::string m = get(port, "/metrics").body;
  const auto at = m.find("\n" + series + " ");
  if (at == std::string::npos)
    return -1;
  return std::stod(m.substr(at + series.size() + 2));
}

// Decode's first events (response.created, ...) come before its first
// token, at once: the time to first token is the time to the first delta.
// Here decode's KV pull takes 400 ms, before its first token.
TEST(ResponsesApi, TimeToFirstTokenIsTheFirstDelta) {
  Sim p("prefill"), d("decode", {"--kv-pull-ms", "400"});
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  const auto r =
      http_request(gw.port(), "POST", "/v1/responses", responses_request(true).dump(), kJson);
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_TRUE(eventually([&] {
    return metric_value(gw.port(), "pdgate_time_to_first_token_seconds_count{stream=\"true\"}") ==
           1;
  }));
  EXPECT_GE(metric_value(gw.port(), "pdgate_time_to_first_token_seconds_sum{stream=\"true\"}"),
            0.4);
}

// A decode that keeps its blocks for a next turn names them (its host,
// port, engine id) in response.completed's response: the client must not
// see them unless --expose-kv-params, as for completions; the event keeps
// its name.
TEST(ResponsesApi, DecodeParamsInTheCompletedEventAreHidden) {
  Sim p("prefill"), d("decode", {"--issue-decode-kv"});
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  const auto r =
      http_request(gw.port(), "POST", "/v1/responses", responses_request(true).dump(), kJson);
  ASSERT_EQ(r.status, 200) << r.body;
  const auto dec = engine_requests(d.port(), "/v1/responses");
  ASSERT_EQ(dec.size(), 1u);
  ASSERT_TRUE(dec[0]["kv_params_issued"].get<bool>());
  EXPECT_EQ(r.body.find("kv_transfer_params"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find(std::to_string(d.port())), std::string::npos) << r.body;
  const auto events = raw_events(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().rfind("event: response.completed\n", 0), 0u) << events.back();
  const Json done = Json::parse(sse_data(events.back())[0]);
  EXPECT_EQ(done["type"], "response.completed");
  EXPECT_EQ(done["response"]["usage"]["output_tokens"], 5);
}

// Not streamed: the whole response object, decode's, with the usage the
// gateway counts.
TEST(ResponsesApi, WholeAnswerThroughPrefillAndDecode) {
  Sim p("prefill"), d("decode");
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  Json body = responses_request(false);
  body["previous_response_id"] = "resp_earlier";
  const auto r = post_json(gw.port(), "/v1/responses", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["status"], "completed");
  EXPECT_EQ(j["output"][0]["content"][0]["type"], "output_text");
  EXPECT_EQ(j["usage"]["output_tokens"], 5);
  EXPECT_EQ(j["previous_response_id"], "resp_earlier");
  // The gateway hides decode's (null) params from the client.
  EXPECT_FALSE(j.contains("kv_transfer_params")) << r.body;
  const auto pre = engine_requests(p.port(), "/v1/responses");
  const auto dec = engine_requests(d.port(), "/v1/responses");
  ASSERT_EQ(pre.size(), 1u);
  ASSERT_EQ(dec.size(), 1u);
  // previous_response_id goes to both engines unchanged: they resolve it.
  EXPECT_EQ(Json::parse(pre[0]["body"].get<std::string>())["previous_response_id"], "resp_earlier");
  EXPECT_EQ(Json::parse(dec[0]["body"].get<std::string>())["previous_response_id"], "resp_earlier");
  EXPECT_EQ(dec[0]["kv_result"], "valid");
  EXPECT_TRUE(counted(gw.port(), "/v1/responses", 200, 1));
}

// What vLLM would refuse, refused before any engine: no input, a
// background response (fetched later from one engine: no route for that).
TEST(ResponsesApi, BadRequestsAreRefusedBeforeTheEngines) {
  Sim p("prefill"), d("decode");
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  for (const Json& body : {Json{{"model", "sim-model"}}, Json{{"model", "sim-model"}, {"input", 3}},
                           Json{{"model", "sim-model"}, {"input", "x"}, {"max_output_tokens", 0}},
                           Json{{"model", "sim-model"}, {"input", "x"}, {"background", true}}}) {
    const auto r = post_json(gw.port(), "/v1/responses", body);
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.body;
    EXPECT_EQ(r.json()["error"]["type"], "BadRequestError") << r.body;
  }
  EXPECT_TRUE(engine_requests(p.port(), "/v1/responses").empty());
}

// FNV-1a 64 as the sim hashes an upload.
std::string fnv1a64_hex(const std::string& bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

// Every forwarded endpoint: one decode engine answers, its body reaches
// the client as it wrote it, and the route is counted.
TEST(ForwardedApis, EachEndpointReachesOneEngine) {
  Sim p("prefill"), d("decode");
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  const std::vector<std::pair<std::string, Json>> calls = {
      {"/tokenize", {{"model", "sim-model"}, {"prompt", "hello world"}}},
      {"/detokenize", {{"model", "sim-model"}, {"tokens", {1819043176, 1870078063, 6581362}}}},
      {"/v1/embeddings", {{"model", "sim-model"}, {"input", {"a", "b"}}}},
      {"/pooling", {{"model", "sim-model"}, {"input", "a"}}},
      {"/classify", {{"model", "sim-model"}, {"input", {"a", "b"}}}},
      {"/score", {{"model", "sim-model"}, {"text_1", "q"}, {"text_2", {"a", "b"}}}},
      {"/v1/score", {{"model", "sim-model"}, {"text_1", "q"}, {"text_2", "a"}}},
      {"/rerank", {{"model", "sim-model"}, {"query", "q"}, {"documents", {"a", "b", "c"}}}},
      {"/v1/rerank", {{"model", "sim-model"}, {"query", "q"}, {"documents", {"a"}}}},
      {"/v2/rerank", {{"model", "sim-model"}, {"query", "q"}, {"documents", {"a", "b"}}}},
  };
  for (const auto& [path, body] : calls) {
    const auto direct = http_request(d.port(), "POST", path, body.dump(), kJson);
    ASSERT_EQ(direct.status, 200) << path << ": " << direct.body;
    const auto r = http_request(gw.port(), "POST", path, body.dump(), kJson);
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    // The sim's answers are deterministic but for the request id it names.
    Json got = r.json(), want = direct.json();
    got.erase("id");
    want.erase("id");
    got.erase("created");
    want.erase("created");
    EXPECT_EQ(got, want) << path;
    EXPECT_FALSE(r.header("x-request-id").empty()) << path;
    EXPECT_TRUE(counted(gw.port(), path, 200, 1)) << path;
    // Decode answered; prefill never saw it.
    EXPECT_EQ(engine_requests(d.port(), path).size(), 2u) << path;
    EXPECT_TRUE(engine_requests(p.port(), path).empty()) << path;
  }
  EXPECT_EQ(
      http_request(
          gw.port(), "POST", "/detokenize",
          Json{{"model", "sim-model"}, {"tokens", {1819043176, 1870078063, 6581362}}}.dump(), kJson)
          .json()["prompt"],
      "hello world");
  // An engine's 4xx is its answer: an unknown model's 404, as vLLM wrote it.
  const auto unknown = http_request(gw.port(), "POST", "/v1/embeddings",
                                    Json{{"model", "other"}, {"input", "a"}}.dump(), kJson);
  EXPECT_EQ(unknown.status, 404) << unknown.body;
  EXPECT_EQ(unknown.json()["error"]["message"], "The model `other` does not exist.");
  EXPECT_TRUE(counted(gw.port(), "/v1/embeddings", 404, 1));
}

// An audio upload: multipart/form-data, forwarded as it came (the engine
// hashes the file's bytes: the same hash means the same bytes).
TEST(ForwardedApis, AudioTranscriptionUploadArrivesIntact) {
  Sim p("prefill"), d("decode");
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  std::string audio;
  for (int i = 0; i < 200000; ++i)
    audio.push_back(static_cast<char>((i * 7 + i / 256) & 0xff));
  const std::string boundary = "pdgate-test-boundary-42";
  std::string form = "--" + boundary +
                     "\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nsim-model\r\n--" +
                     boundary +
                     "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
                     "Content-Type: audio/wav\r\n\r\n" +
                     audio + "\r\n--" + boundary + "--\r\n";
  const auto r = http_request(gw.port(), "POST", "/v1/audio/transcriptions", form,
                              {{"Content-Type", "multipart/form-data; boundary=" + boundary}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["text"],
            std::to_string(audio.size()) + " bytes of audio, fnv1a64 " + fnv1a64_hex(audio));
  const auto seen = engine_requests(d.port(), "/v1/audio/transcriptions");
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0]["headers"]["content-type"], "multipart/form-data; boundary=" + boundary);
  EXPECT_TRUE(counted(gw.port(), "/v1/audio/transcriptions", 200, 1));
  // A JSON body is no upload.
  const auto json = http_request(gw.port(), "POST", "/v1/audio/transcriptions", "{}", kJson);
  EXPECT_EQ(json.status, 415) << json.body;
}

// With API keys on, the forwarded endpoints need a client key as the
// completions do; a connection refused by one engine goes to another
// (health checks off, so the dead instance stays in the rotation).
TEST(ForwardedApis, NeedAKeyAndFailOverOnConnectionErrors) {
  Sim d("decode");
  const auto keys = std::filesystem::temp_directory_path() /
                    ("pdgate-api-keys-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(keys) << "keys:\n  - name: team\n    sha256: " << *sha256_hex("sk-team") << "\n";
  const std::string dead = "127.0.0.1:" + std::to_string(closed_port());
  Gateway gw({"--prefill-servers-urls", "disable", "--decode-servers-urls",
              "http://" + dead + ",http://" + d.hostport(), "--api-keys", keys.string(),
              "--eject-after", "1000", "--health-interval", "off"});
  std::filesystem::remove(keys);
  const std::string body = Json{{"model", "sim-model"}, {"input", "a"}}.dump();
  // Refused before any engine, without a key or with a wrong one, on every
  // route that reaches an engine.
  for (const std::string path :
       {"/tokenize", "/detokenize", "/v1/embeddings", "/pooling", "/classify", "/score",
        "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/v1/audio/transcriptions",
        "/v1/audio/translations", "/v1/responses"}) {
    for (const Headers& h : {kJson, Headers{{"Content-Type", "application/json"},
                                            {"Authorization", "Bearer sk-stranger"}}}) {
      const auto refused = http_request(gw.port(), "POST", path, body, h);
      EXPECT_EQ(refused.status, 401) << path << ": " << refused.body;
      EXPECT_EQ(refused.json()["error"]["type"], "AuthenticationError") << path;
    }
    EXPECT_TRUE(engine_requests(d.port(), path).empty()) << path;
  }
  const auto models = get(gw.port(), "/v1/models");
  EXPECT_EQ(models.status, 401) << models.body;
  const Headers auth = {{"Content-Type", "application/json"}, {"Authorization", "Bearer sk-team"}};
  for (int i = 0; i < 4; ++i) {
    const auto r = http_request(gw.port(), "POST", "/v1/embeddings", body, auth);
    EXPECT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(engine_requests(d.port(), "/v1/embeddings").size(), 4u);
  // Round robin sent some of them to the dead instance first: each went on
  // to the live one.
  const std::string m = get(gw.port(), "/metrics").body;
  const std::string series = "pdgate_retries_total{stage=\"decode\"} ";
  const auto at = m.find(series);
  ASSERT_NE(at, std::string::npos) << m;
  EXPECT_GE(std::stod(m.substr(at + series.size())), 1) << m;
  EXPECT_TRUE(counted(gw.port(), "/v1/embeddings", 401, 2));
  EXPECT_TRUE(counted(gw.port(), "/v1/embeddings", 200, 4));
  // /v1/responses in one hop, with the key.
  const auto one = http_request(gw.port(), "POST", "/v1/responses", body, auth);
  EXPECT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(one.json()["usage"]["output_tokens"].get<int>() > 0, true);
}

}  // namespace
}  // namespace pdgate::test
