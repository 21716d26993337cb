// The multimodal encode stage end to end (E -> P -> D and E -> PD): real
// pdgate in front of pdgate-sim encoders, prefill, decode and combined
// instances. Each test checks the exact requests the engines received.
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

// Items written the way no JSON library would re-serialize them (spaces,
// an escaped slash, key order), so only a byte copy matches.
const std::string kImage =
    R"({ "type" : "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo\/AAAA"} })";
const std::string kAudio =
    R"({"input_audio": {"format":"wav", "data":"UklGRiQAAABXQVZF"}, "type": "input_audio"})";

std::string mm_body(bool stream) {
  return R"({"model": "sim-model", "messages": [{"role": "system", "content": "Be brief."},)"
         R"( {"role": "user", "content": [{"type": "text", "text": "What is this?"}, )" +
         kImage + ", " + kAudio + R"(]}], "max_tokens": 4, "stream": )" +
         (stream ? "true" : "false") + "}";
}

std::string encoder_body(const std::string& item) {
  return R"({"model":"sim-model","messages":[{"role":"user","content":[)" + item +
         R"(]}],"max_tokens":1,"stream":false})";
}

Response post_raw(std::uint16_t port, const std::string& body, const std::string& rid) {
  return http_request(port, "POST", "/v1/chat/completions", body,
                      {{"Content-Type", "application/json"}, {"X-Request-Id", rid}});
}

Json all_requests(std::initializer_list<Sim*> sims) {
  Json all = Json::array();
  for (auto* s : sims)
    for (auto& r : s->requests())
      all.push_back(r);
  return all;
}

// Checks that the encoders got exactly one request per item, each with the
// item alone, byte-identical, under a child request id of `rid`.
void expect_encoder_requests(const Json& enc, const std::string& rid) {
  ASSERT_EQ(enc.size(), 2u) << enc.dump();
  std::set<std::string> bodies;
  std::set<std::string> indices;
  const std::regex child(std::regex_replace(rid, std::regex("[-]"), "\\-") + ":([01]):[0-9a-f]{6}");
  for (const auto& r : enc) {
    EXPECT_EQ(r["path"], "/v1/chat/completions");
    EXPECT_EQ(r["status"], 200);
    bodies.insert(r["body"].get<std::string>());
    std::smatch m;
    const std::string id = r["x_request_id"].get<std::string>();
    ASSERT_TRUE(std::regex_match(id, m, child)) << id;
    indices.insert(m[1]);
  }
  EXPECT_EQ(bodies, (std::set<std::string>{encoder_body(kImage), encoder_body(kAudio)}));
  EXPECT_EQ(indices, (std::set<std::string>{"0", "1"}));
}

class EncodeStage : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    e1 = new Sim("encode");
    e2 = new Sim("encode");
    p = new Sim("prefill");
    d = new Sim("decode", {"--itl-ms", "2"});
    pd = new Sim("both", {"--itl-ms", "2"});
    epd = new Gateway({"--encode-servers-urls", e1->url() + "," + e2->url(),
                       "--prefill-servers-urls", p->url(), "--decode-servers-urls", d->url()});
    e_pd = new Gateway({"--encode-servers-urls", e1->url() + "," + e2->url(),
                        "--prefill-servers-urls", "disable", "--decode-servers-urls", pd->url()});
  }
  static void TearDownTestSuite() {
    delete epd;
    delete e_pd;
    for (auto* s : {e1, e2, p, d, pd})
      delete s;
  }
  void SetUp() override {
    for (auto* s : {e1, e2, p, d, pd})
      s->clear();
  }
  static inline Sim *e1, *e2, *p, *d, *pd;
  static inline Gateway *epd, *e_pd;
};

// E -> P -> D, not streaming: one encoder request per item (round-robin over
// both encoders), then the NIXL handshake with the original messages.
TEST_F(EncodeStage, EpdNonStreaming) {
  auto r = post_raw(epd->port(), mm_body(false), "req-epd-1");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["usage"]["completion_tokens"], 4);
  expect_encoder_requests(all_requests({e1, e2}), "req-epd-1");
  EXPECT_EQ(e1->requests().size(), 1u);
  EXPECT_EQ(e2->requests().size(), 1u);
  auto pre = p->requests();
  auto dec = d->requests();
  ASSERT_EQ(pre.size(), 1u);
  ASSERT_EQ(dec.size(), 1u);
  const std::string pb = pre[0]["body"];
  const std::string db = dec[0]["body"];
  // Both see the media bytes exactly as the client sent them.
  for (const auto& item : {kImage, kAudio}) {
    EXPECT_NE(pb.find(item), std::string::npos);
    EXPECT_NE(db.find(item), std::string::npos);
  }
  EXPECT_EQ(Json::parse(pb)["max_tokens"], 1);
  EXPECT_EQ(Json::parse(db)["kv_transfer_params"]["do_remote_prefill"], true);
  EXPECT_EQ(dec[0]["kv_result"], "valid");
  // Prefill only starts once every encoder has answered. The sim stamps
  // first_byte_at_ms just before it writes its answer, and ended_at_ms only
  // when its own write completion runs, which under load can come after the
  // gateway has read the answer and sent the prefill request.
  for (const auto& e : all_requests({e1, e2})) {
    EXPECT_LE(e["first_byte_at_ms"].get<std::int64_t>(),
              pre[0]["received_at_ms"].get<std::int64_t>());
  }
  EXPECT_EQ(e1->stats()["encoder_violations_total"], 0);
}

// E -> P -> D, streaming: same encoder requests; the stream ends in [DONE].
TEST_F(EncodeStage, EpdStreaming) {
  auto r = post_raw(epd->port(), mm_body(true), "req-epd-2");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(sse_data(r.body).back(), "[DONE]");
  expect_encoder_requests(all_requests({e1, e2}), "req-epd-2");
  ASSERT_EQ(p->requests().size(), 1u);
  auto dec = d->requests();
  ASSERT_EQ(dec.size(), 1u);
  EXPECT_EQ(Json::parse(dec[0]["body"].get<std::string>())["stream"], true);
  EXPECT_EQ(dec[0]["kv_result"], "valid");
}

// E -> PD, not streaming and streaming: encoders first, then the client's
// body untouched to the combined instance.
TEST_F(EncodeStage, EpdWithPrefillDisabled) {
  for (bool stream : {false, true}) {
    for (auto* s : {e1, e2, pd})
      s->clear();
    const std::string body = mm_body(stream);
    auto r = post_raw(e_pd->port(), body, "req-e-pd");
    ASSERT_EQ(r.status, 200) << r.body;
    if (stream) {
      EXPECT_EQ(sse_data(r.body).back(), "[DONE]");
    }
    expect_encoder_requests(all_requests({e1, e2}), "req-e-pd");
    auto seen = pd->requests();
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0]["body"], body);
    EXPECT_EQ(seen[0]["x_request_id"], "req-e-pd");
  }
}

// A request without media skips the encoders.
TEST_F(EncodeStage, TextOnlySkipsTheEncoders) {
  Json body = {
      {"model", "sim-model"},
      {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}}}}}}},
      {"max_tokens", 2}};
  auto r = post_json(epd->port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(all_requests({e1, e2}).empty());
  EXPECT_EQ(d->requests().size(), 1u);
}

// An encoder answering 500 fails the request with a 502 naming the encode
// stage; the encoder that hangs is aborted and P/D see nothing.
TEST(EncodeFailure, ServerErrorFailsFastWithoutPd) {
  Sim bad("encode", {"--error-rate", "1"});
  Sim slow("encode", {"--hang"});
  Sim p("prefill"), d("decode");
  Gateway gw({"--encode-servers-urls", bad.url() + "," + slow.url(), "--prefill-servers-urls",
              p.url(), "--decode-servers-urls", d.url()});
  for (bool stream : {false, true}) {
    const auto start = Clock::now();
    auto r = post_raw(gw.port(), mm_body(stream), "req-fail");
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
    ASSERT_EQ(r.status, 502) << r.body;
    const std::string msg = r.json()["error"]["message"];
    EXPECT_NE(msg.find("encode stage"), std::string::npos) << msg;
    EXPECT_TRUE(p.requests().empty());
    EXPECT_TRUE(d.requests().empty());
    // The hanging encoder's request, if it got there before the abort, is
    // aborted rather than left running.
    EXPECT_TRUE(eventually([&] {
      for (const auto& s : slow.requests())
        if (s["outcome"] != "aborted")
          return false;
      return true;
    })) << slow.requests().dump();
    slow.clear();
  }
}

// An encoder's own 4xx (here: the media is too long for it) reaches the
// client with its status and message; P/D see nothing.
TEST(EncodeFailure, ClientErrorIsRelayed) {
  Sim e("encode", {"--max-model-len", "2"});
  Sim pd("both");
  Gateway gw({"--encode-servers-urls", e.url(), "--prefill-servers-urls", "disable",
              "--decode-servers-urls", pd.url()});
  auto r = post_raw(gw.port(), mm_body(false), "req-4xx");
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("maximum context length"), std::string::npos) << r.body;
  EXPECT_TRUE(pd.requests().empty());
}

// The client leaving while the encoders work aborts them; P/D see nothing.
TEST(EncodeFailure, ClientLeavingAbortsTheEncoders) {
  Sim e("encode", {"--hang"});
  Sim pd("both");
  Gateway gw({"--encode-servers-urls", e.url(), "--prefill-servers-urls", "disable",
              "--decode-servers-urls", pd.url()});
  {
    Connection c(gw.port());
    c.send_request("POST", "/v1/chat/completions", mm_body(false),
                   {{"Content-Type", "application/json"}});
    ASSERT_TRUE(eventually([&] { return e.requests().size() == 2; }));
  }
  EXPECT_TRUE(eventually([&] {
    for (const auto& r : e.requests())
      if (r["outcome"] != "aborted")
        return false;
    return true;
  })) << e.requests().dump();
  EXPECT_TRUE(pd.requests().empty());
}

}  // namespace
}  // namespace pdgate::test
