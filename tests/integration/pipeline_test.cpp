// The P/D pipeline end to end: real pdgate in front of real pdgate-sim
// prefill and decode processes. Each test checks what the engines received
// and what the client got.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

Json chat_body(bool stream, int max_tokens = 5) {
  Json b = {{"model", "sim-model"},
            {"messages", {{{"role", "user"}, {"content", "Tell me about disaggregated serving."}}}},
            {"max_tokens", max_tokens},
            {"stream", stream}};
  return b;
}

Json completion_body(bool stream, int max_tokens = 5) {
  return {{"model", "sim-model"},
          {"prompt", "The capital of France is"},
          {"max_tokens", max_tokens},
          {"stream", stream}};
}

// Two prefill and two decode engines behind one gateway.
class PdPipeline : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    p1 = new Sim("prefill");
    p2 = new Sim("prefill");
    d1 = new Sim("decode", {"--itl-ms", "2"});
    d2 = new Sim("decode", {"--itl-ms", "2"});
    // No health checks or metrics scrapes: they open connections of their
    // own, which KeepAliveClientAndUpstream would count.
    gw = new Gateway(
        {"--model", "sim-model", "--prefill", p1->hostport(), p2->hostport(), "--decode",
         d1->hostport(), d2->hostport(), "--health-interval", "off", "--metrics-interval", "off"},
        {{"OPENAI_API_KEY", "sk-from-env"}});
  }
  static void TearDownTestSuite() {
    delete gw;
    delete p1;
    delete p2;
    delete d1;
    delete d2;
  }
  void SetUp() override {
    for (auto* s : {p1, p2, d1, d2})
      s->clear();
  }
  // All completion requests the engines of one role saw, in order.
  static Json seen(Sim* a, Sim* b) {
    Json all = a->requests();
    for (auto& r : b->requests())
      all.push_back(r);
    return all;
  }

  static inline Sim* p1 = nullptr;
  static inline Sim* p2 = nullptr;
  static inline Sim* d1 = nullptr;
  static inline Sim* d2 = nullptr;
  static inline Gateway* gw = nullptr;
};

// A non-streaming completion runs prefill (rewritten body) then decode (the
// client's body plus the prefill's params); the client gets decode's answer.
TEST_F(PdPipeline, CompletionNonStreamingRunsTheHandshake) {
  Json body = completion_body(false, 7);
  body["min_tokens"] = 2;
  auto r = post_json(gw->port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = r.json();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["usage"]["completion_tokens"], 7);

  Json pre = seen(p1, p2);
  Json dec = seen(d1, d2);
  ASSERT_EQ(pre.size(), 1u);
  ASSERT_EQ(dec.size(), 1u);
  Json pb = Json::parse(pre[0]["body"].get<std::string>());
  EXPECT_EQ(pb["stream"], false);
  EXPECT_EQ(pb["max_tokens"], 1);
  EXPECT_FALSE(pb.contains("min_tokens"));
  EXPECT_FALSE(pb.contains("stream_options"));
  EXPECT_EQ(pb["kv_transfer_params"]["do_remote_decode"], true);
  EXPECT_EQ(pb["kv_transfer_params"]["do_remote_prefill"], false);
  EXPECT_TRUE(pb["kv_transfer_params"]["remote_engine_id"].is_null());
  EXPECT_EQ(pb["prompt"], body["prompt"]);

  Json db = Json::parse(dec[0]["body"].get<std::string>());
  EXPECT_EQ(db["max_tokens"], 7);
  EXPECT_EQ(db["min_tokens"], 2);
  EXPECT_EQ(db["kv_transfer_params"]["do_remote_prefill"], true);
  // The decode pulled the blocks the prefill issued, exactly once.
  EXPECT_EQ(dec[0]["kv_result"], "valid");
  EXPECT_EQ(dec[0]["outcome"], "completed");
}

// A streaming chat request: every SSE event reaches the client, including
// the first role delta, the usage chunk and [DONE].
TEST_F(PdPipeline, ChatStreamingRelaysEveryEvent) {
  Json body = chat_body(true, 6);
  body["stream_options"] = {{"include_usage", true}};
  auto r = post_json(gw->port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.header("content-type").find("text/event-stream"), std::string::npos);
  auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  auto first = Json::parse(events.front());
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  auto usage = Json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 6);
  int content_chunks = 0;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    auto e = Json::parse(events[i]);
    if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content") &&
        !e["choices"][0]["delta"]["content"].get<std::string>().empty())
      ++content_chunks;
  }
  EXPECT_EQ(content_chunks, 6);

  Json pre = seen(p1, p2);
  ASSERT_EQ(pre.size(), 1u);
  Json pb = Json::parse(pre[0]["body"].get<std::string>());
  EXPECT_EQ(pb["stream"], false);
  EXPECT_EQ(pb["max_tokens"], 1);
  EXPECT_FALSE(pb.contains("stream_options"));
  Json dec = seen(d1, d2);
  ASSERT_EQ(dec.size(), 1u);
  Json db = Json::parse(dec[0]["body"].get<std::string>());
  EXPECT_EQ(db["stream"], true);
  EXPECT_EQ(db["messages"], body["messages"]);
  EXPECT_EQ(db["stream_options"], body["stream_options"]);
  EXPECT_EQ(dec[0]["kv_result"], "valid");
}

// A non-streaming chat request returns decode's JSON answer.
TEST_F(PdPipeline, ChatNonStreaming) {
  auto r = post_json(gw->port(), "/v1/chat/completions", chat_body(false, 4));
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = r.json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  EXPECT_EQ(seen(d1, d2)[0]["kv_result"], "valid");
}

// A streaming completion passes the text chunks and [DONE] through.
TEST_F(PdPipeline, CompletionStreaming) {
  auto r = post_json(gw->port(), "/v1/completions", completion_body(true, 5));
  ASSERT_EQ(r.status, 200) << r.body;
  auto events = sse_data(r.body);
  ASSERT_EQ(events.back(), "[DONE]");
  std::string finish;
  int texts = 0;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    auto e = Json::parse(events[i]);
    if (e["choices"].empty())
      continue;
    if (e["choices"][0].contains("text") && !e["choices"][0]["text"].get<std::string>().empty())
      ++texts;
    if (!e["choices"][0]["finish_reason"].is_null())
      finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(texts, 5);
  EXPECT_EQ(finish, "length");
}

// Round-robin spreads requests evenly over both prefills and both decodes.
TEST_F(PdPipeline, RoundRobinUsesEveryInstance) {
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(post_json(gw->port(), "/v1/completions", completion_body(false, 1)).status, 200);
  }
  EXPECT_EQ(p1->requests().size(), 2u);
  EXPECT_EQ(p2->requests().size(), 2u);
  EXPECT_EQ(d1->requests().size(), 2u);
  EXPECT_EQ(d2->requests().size(), 2u);
}

// The client's X-Request-Id goes to prefill and decode and comes back.
TEST_F(PdPipeline, ClientRequestIdReachesBothStages) {
  auto r = post_json(gw->port(), "/v1/completions", completion_body(false, 2),
                     {{"X-Request-Id", "client-rid-42"}});
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("x-request-id"), "client-rid-42");
  EXPECT_EQ(seen(p1, p2)[0]["headers"]["x-request-id"], "client-rid-42");
  EXPECT_EQ(seen(d1, d2)[0]["headers"]["x-request-id"], "client-rid-42");
}

// Without a client id, one fresh UUID is shared by both stages and returned.
TEST_F(PdPipeline, GeneratedRequestIdIsSharedAndReturned) {
  auto r = post_json(gw->port(), "/v1/completions", completion_body(false, 2));
  ASSERT_EQ(r.status, 200);
  const std::string rid = r.header("x-request-id");
  EXPECT_EQ(rid.size(), 36u);
  EXPECT_EQ(seen(p1, p2)[0]["headers"]["x-request-id"], rid);
  EXPECT_EQ(seen(d1, d2)[0]["headers"]["x-request-id"], rid);
  auto r2 = post_json(gw->port(), "/v1/completions", completion_body(false, 2));
  EXPECT_NE(r2.header("x-request-id"), rid);
}

// The client's Authorization is forwarded; without one, OPENAI_API_KEY is.
TEST_F(PdPipeline, AuthorizationForwardedOrTakenFromEnvironment) {
  ASSERT_EQ(post_json(gw->port(), "/v1/completions", completion_body(false, 1),
                      {{"Authorization", "Bearer client-key"}})
                .status,
            200);
  EXPECT_EQ(seen(p1, p2)[0]["headers"]["authorization"], "Bearer client-key");
  EXPECT_EQ(seen(d1, d2)[0]["headers"]["authorization"], "Bearer client-key");
  for (auto* s : {p1, p2, d1, d2})
    s->clear();
  ASSERT_EQ(post_json(gw->port(), "/v1/completions", completion_body(false, 1)).status, 200);
  EXPECT_EQ(seen(p1, p2)[0]["headers"]["authorization"], "Bearer sk-from-env");
  EXPECT_EQ(seen(d1, d2)[0]["headers"]["authorization"], "Bearer sk-from-env");
}

// A body that is not JSON is refused with 400 and never reaches an engine.
TEST_F(PdPipeline, InvalidJsonIs400) {
  auto r = http_request(gw->port(), "POST", "/v1/completions",
                        "{\"model\": ", {{"Content-Type", "application/json"}});
  EXPECT_EQ(r.status, 400);
  auto j = r.json();
  EXPECT_EQ(j["error"]["code"], 400);
  EXPECT_EQ(j["error"]["type"], "BadRequestError");
  EXPECT_TRUE(j["error"].contains("param"));
  EXPECT_NE(j["error"]["message"].get<std::string>().find("JSON"), std::string::npos);
  EXPECT_TRUE(seen(p1, p2).empty());
}

// A Content-Type other than JSON is refused with 415.
TEST_F(PdPipeline, WrongContentTypeIs415) {
  auto r = http_request(gw->port(), "POST", "/v1/completions", completion_body(false).dump(),
                        {{"Content-Type", "text/plain"}});
  EXPECT_EQ(r.status, 415);
  EXPECT_EQ(r.json()["error"]["code"], 415);
  EXPECT_TRUE(seen(p1, p2).empty());
}

// A prefill 4xx (unknown model) reaches the client with its status and body.
TEST_F(PdPipeline, PrefillClientErrorPassesThrough) {
  Json body = completion_body(false);
  body["model"] = "no-such-model";
  auto r = post_json(gw->port(), "/v1/completions", body);
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("no-such-model"), std::string::npos) << r.body;
  EXPECT_TRUE(seen(d1, d2).empty());
}

// Unknown routes and wrong methods get OpenAI-style errors.
TEST_F(PdPipeline, UnknownRouteAndWrongMethod) {
  auto r = get(gw->port(), "/v1/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.json()["error"]["code"], 404);
  auto m = get(gw->port(), "/v1/completions");
  EXPECT_EQ(m.status, 405);
}

// /v1/models comes from a decode instance; /health and /status answer.
TEST_F(PdPipeline, ModelsHealthStatus) {
  auto m = get(gw->port(), "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.json()["data"][0]["id"], "sim-model");
  EXPECT_EQ(get(gw->port(), "/health").status, 200);
  auto s = gw->status();
  EXPECT_EQ(s["prefill_node_count"], 2);
  EXPECT_EQ(s["decode_node_count"], 2);
  EXPECT_EQ(s["instances"]["decode"].size(), 2u);
  EXPECT_EQ(s["instances"]["decode"][0]["in_flight"], 0);
}

// Several requests share one client connection (HTTP/1.1 keep-alive), and
// the gateway reuses its upstream connections instead of opening new ones.
TEST_F(PdPipeline, KeepAliveClientAndUpstream) {
  // The sims are shared by the suite: count only the connections opened
  // from here on. Each stats() call is one connection of its own.
  int before[2];
  for (int k = 0; k < 2; ++k)
    before[k] = (k == 0 ? d1 : d2)->stats()["connections_total"].get<int>();
  Connection c(gw->port());
  constexpr int kRequests = 20;
  for (int i = 0; i < kRequests; ++i) {
    c.send_request("POST", "/v1/completions", completion_body(i % 2 == 0, 2).dump());
    auto r = c.read_response();
    ASSERT_EQ(r.status, 200) << r.body;
  }
  // 20 requests on one client connection, 10 per decode: without upstream
  // keep-alive that is 10 connections per decode; with it, one per worker
  // that served them (at most 2) plus the stats() call.
  for (int k = 0; k < 2; ++k) {
    auto st = (k == 0 ? d1 : d2)->stats();
    EXPECT_LE(st["connections_total"].get<int>() - before[k], 3) << st.dump();
  }
}

// A request body over --max-body-size is refused with 413; a header over
// the header limit with 431.
TEST(Limits, BodyAndHeaderLimits) {
  Sim p("prefill"), d("decode");
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport(), "--max-body-size", "1KiB",
              "--max-header-size", "2KiB"});
  Json big = completion_body(false);
  big["prompt"] = std::string(4096, 'x');
  auto r = post_json(gw.port(), "/v1/completions", big);
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.json()["error"]["code"], 413);
  auto h = http_request(gw.port(), "POST", "/v1/completions", completion_body(false).dump(),
                        {{"X-Big", std::string(4096, 'y')}});
  EXPECT_EQ(h.status, 431);
  EXPECT_TRUE(p.requests().empty());
  // The gateway still serves normal requests afterwards.
  EXPECT_EQ(post_json(gw.port(), "/v1/completions", completion_body(false, 1)).status, 200);
}

// Bodies much larger than what arrives with the header are read straight
// into the request (no copy through the read buffer): sent in pieces, with
// and without Expect: 100-continue, they reach both engines byte for byte;
// a body cut short or stalled costs only its own connection.
TEST(Limits, LargeBodiesInPieces) {
  const std::vector<std::string> roomy = {
      "--max-model-len", "1000000", "--kv-blocks", "1000000", "--prefill-us-per-token", "0"};
  Sim p("prefill", roomy), d("decode", roomy);
  Gateway gw(
      {"--prefill", p.hostport(), "--decode", d.hostport(), "--client-idle-timeout", "500ms"});
  std::string prompt;
  for (int i = 0; prompt.size() < 300 * 1024; ++i)
    prompt += "piece " + std::to_string(i) + " \u00e9\n ";
  Json body = completion_body(false, 1);
  body["prompt"] = prompt;
  const std::string text = body.dump();
  for (const bool expect : {false, true}) {
    p.clear();
    d.clear();
    Connection c(gw.port());
    std::string head =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
        "application/json\r\nContent-Length: " +
        std::to_string(text.size()) + "\r\n";
    if (expect)
      head += "Expect: 100-continue\r\n";
    c.send_raw(head + "\r\n" + text.substr(0, 1000));
    if (expect) {
      const auto cont = c.read_head();
      EXPECT_EQ(cont.status, 100);
    }
    for (std::size_t at = 1000; at < text.size(); at += 70001) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      c.send_raw(text.substr(at, 70001));
    }
    const auto r = c.read_response();
    ASSERT_EQ(r.status, 200) << r.body;
    for (Sim* s : {&p, &d}) {
      const auto reqs = s->requests();
      ASSERT_EQ(reqs.size(), 1u);
      EXPECT_EQ(Json::parse(reqs[0]["body"].get<std::string>())["prompt"], prompt)
          << (s == &p ? "prefill" : "decode");
    }
    // The connection is reused for a small request afterwards.
    c.send_request("POST", "/v1/completions", completion_body(false, 1).dump());
    EXPECT_EQ(c.read_response().status, 200);
  }
  // Cut short: the client closes mid-body. Nothing reaches the engines.
  p.clear();
  d.clear();
  {
    Connection c(gw.port());
    c.send_raw(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
        "application/json\r\nContent-Length: " +
        std::to_string(text.size()) + "\r\n\r\n" + text.substr(0, 100000));
    c.close();
  }
  // Stalled: half the body, then nothing; the connection is closed after
  // the idle timeout (as nginx's client_body_timeout does).
  {
    Connection c(gw.port());
    const auto start = Clock::now();
    c.send_raw(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
        "application/json\r\nContent-Length: " +
        std::to_string(text.size()) + "\r\n\r\n" + text.substr(0, 100000));
    EXPECT_TRUE(c.peer_closed(std::chrono::seconds(5)));
    EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(400));
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  }
  EXPECT_TRUE(p.requests().empty());
  EXPECT_TRUE(d.requests().empty());
  EXPECT_EQ(post_json(gw.port(), "/v1/completions", completion_body(false, 1)).status, 200);
}

// A client that sends half a header and stalls is cut off by the header timeout.
TEST(Limits, HeaderTimeout) {
  Sim d("decode");
  Gateway gw(
      {"--decode", d.hostport(), "--prefill-servers-urls", "disable", "--header-timeout", "300ms"});
  Connection c(gw.port());
  const auto start = Clock::now();
  c.send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  EXPECT_TRUE(c.peer_closed(std::chrono::seconds(5)));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
}

// An engine whose three SSE events (in three HTTP chunks) and its end
// arrive in one piece: the client gets them in one HTTP chunk, followed by
// the end, i.e. one write (before, one chunk and one write per engine
// chunk). The engine is a thread on a raw socket, so the bytes go out in
// exactly one send.
TEST(Streaming, EventsThatArriveTogetherLeaveInOneChunk) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  socklen_t alen = sizeof a;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &alen);
  const std::uint16_t engine_port = ntohs(a.sin_port);
  const std::string events = "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n";
  // Serves connections until the listener closes: the completion gets
  // the burst, anything else (a probe) an empty JSON object.
  std::thread engine([lfd] {
    for (;;) {
      const int c = ::accept(lfd, nullptr, nullptr);
      if (c < 0)
        return;
      std::string got;
      char buf[4096];
      for (;;) {
        // One request: its head, then Content-Length bytes of body.
        std::size_t need = std::string::npos;
        while (need == std::string::npos || got.size() < need) {
          const auto n = ::recv(c, buf, sizeof buf, 0);
          if (n <= 0)
            break;
          got.append(buf, static_cast<std::size_t>(n));
          const auto end = got.find("\r\n\r\n");
          if (need == std::string::npos && end != std::string::npos) {
            const auto cl = got.find("Content-Length: ");
            need = end + 4 +
                   (cl == std::string::npos || cl > end ? 0 : std::stoul(got.substr(cl + 16)));
          }
        }
        if (need == std::string::npos || got.size() < need)
          break;
        const bool completion = got.starts_with("POST /v1/chat/completions");
        got.erase(0, need);
        auto chunk = [](const std::string& data) {
          char size[16];
          std::snprintf(size, sizeof size, "%zx", data.size());
          return std::string(size) + "\r\n" + data + "\r\n";
        };
        const std::string answer =
            completion ? "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n" +
                             chunk("data: {\"n\":1}\n\n") + chunk("data: {\"n\":2}\n\n") +
                             chunk("data: [DONE]\n\n") + "0\r\n\r\n"
                       : "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Content-Length: 2\r\n\r\n{}";
        (void)::send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
      }
      ::close(c);
    }
  });
  {
    Gateway gw({"--decode", "127.0.0.1:" + std::to_string(engine_port), "--prefill-servers-urls",
                "disable", "--health-interval", "off"});
    const std::string body =
        R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true})";
    const int c = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in g{};
    g.sin_family = AF_INET;
    g.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    g.sin_port = htons(gw.port());
    EXPECT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&g), sizeof g), 0);
    const std::string req =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        "Content-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    EXPECT_EQ(::send(c, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    timeval tv{10, 0};
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string raw;
    char buf[4096];
    while (raw.find("\r\n0\r\n\r\n") == std::string::npos) {
      const auto n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0)
        break;
      raw.append(buf, static_cast<std::size_t>(n));
    }
    ::close(c);
    const auto head_end = raw.find("\r\n\r\n");
    EXPECT_EQ(raw.substr(0, 15), "HTTP/1.1 200 OK") << raw;
    char size[16];
    std::snprintf(size, sizeof size, "%zx", events.size());
    // The body: exactly one chunk holding all three events, then the end.
    if (head_end != std::string::npos) {
      EXPECT_EQ(raw.substr(head_end + 4), std::string(size) + "\r\n" + events + "\r\n0\r\n\r\n");
    } else {
      ADD_FAILURE() << "no response head: " << raw;
    }
  }
  ::shutdown(lfd, SHUT_RDWR);
  ::close(lfd);
  engine.join();
}

// A burst of new prompts reaching a gateway of four workers at once is
// spread as one picker would spread it: each pick counts the requests
// picked before it, on whichever worker, so with the four prefills equally
// idle and no prefill done during the burst, each takes a quarter. When
// two workers' picks could miss each other, both took the engine that
// looked idle to each, and one gateway with four workers kept a twentieth
// less of the Mooncake trace cached than with one (bench/README.md).
TEST(ConcurrentPicks, ABurstOnFourWorkersSpreadsLikeOnePicker) {
#ifdef PDGATE_SANITIZED
  // Every P/D test takes the lock under ASan too; this one's exact counts need picks well
  // inside the lock's patience (1 ms), which a 60 KB prompt's pick under ASan is not.
  GTEST_SKIP() << "a pick under ASan lasts about the pick lock's patience";
#endif
  std::vector<std::unique_ptr<Sim>> prefills;
  for (int i = 0; i < 4; ++i)  // 15,000-token prompts take 300 ms: none ends within a burst
    prefills.push_back(
        std::make_unique<Sim>("prefill", std::vector<std::string>{"--prefill-us-per-token", "20"}));
  Sim decode{"decode", {"--itl-ms", "1"}};
  std::vector<std::string> args{"--model",
                                "sim-model",
                                "--workers",
                                "4",
                                "--policy-prefill",
                                "prefix_affinity",
                                "--policy-decode",
                                "least_load",
                                "--health-interval",
                                "off",
                                "--metrics-interval",
                                "off",
                                "--prefill"};
  for (auto& p : prefills)
    args.push_back(p->hostport());
  args.insert(args.end(), {"--decode", decode.hostport()});
  Gateway g(args);
  constexpr int kBursts = 10, kPerBurst = 16;
  int uneven = 0;
  for (int b = 0; b < kBursts; ++b) {
    for (auto& p : prefills)
      p->clear();
    std::atomic<int> ready{0}, ok{0};
    std::vector<std::thread> clients;
    for (int i = 0; i < kPerBurst; ++i) {
      clients.emplace_back([&, i] {
        // No two share their first prefix block (byte 0 names the burst, the
        // rest the request): no prefix match and no shared home.
        std::string prompt(60'000, static_cast<char>('a' + i));
        prompt[0] = static_cast<char>('A' + b);
        Json body = {{"model", "sim-model"}, {"prompt", prompt}, {"max_tokens", 1}};
        ready.fetch_add(1);
        while (ready.load() < kPerBurst)
          std::this_thread::yield();
        if (post_json(g.port(), "/v1/completions", body).status == 200)
          ok.fetch_add(1);
      });
    }
    for (auto& c : clients)
      c.join();
    ASSERT_EQ(ok.load(), kPerBurst);
    std::string counts;
    bool even = true;
    for (auto& p : prefills) {
      const auto n = p->requests().size();
      counts += std::to_string(n) + " ";
      even = even && n == kPerBurst / 4;
    }
    std::printf("burst %d: prefills took %s\n", b, counts.c_str());
    uneven += even ? 0 : 1;
  }
  // A pick that outlasts the lock's patience (1 ms; a 60 KB prompt's pick on a loaded
  // 2-core machine can) is made without it, and its burst ends 4/3/4/5. Measured on
  // 2026-12-02, the test alone: 0-2 such bursts of 10 per run, with this build and the one
  // before it alike. What the check is for is picks that miss each other as a rule, not
  // one pick that ran long.
  EXPECT_LE(uneven, 2) << "bursts not spread 4/4/4/4";
}

}  // namespace
}  // namespace pdgate::test
