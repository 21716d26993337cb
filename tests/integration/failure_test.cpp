// What the client sees when an engine fails at each point of the pipeline,
// and what the engines see when the client goes away.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

Json stream_chat(int max_tokens) {
  return {{"model", "sim-model"},
          {"messages", {{{"role", "user"}, {"content", "hello there"}}}},
          {"max_tokens", max_tokens},
          {"stream", true}};
}

Json completion(bool stream, int max_tokens = 3) {
  return {{"model", "sim-model"},
          {"prompt", "a prompt"},
          {"max_tokens", max_tokens},
          {"stream", stream}};
}

std::string error_message(const Response& r) {
  return r.json()["error"]["message"].get<std::string>();
}

// A prefill that refuses connections yields a 502 naming the prefill stage;
// the decode is never called.
TEST(PrefillFailure, RefusedIs502NamingTheStage) {
  Sim d("decode");
  Gateway gw({"--prefill", "127.0.0.1:" + std::to_string(closed_port()), "--decode", d.hostport()});
  auto r = post_json(gw.port(), "/v1/completions", completion(false));
  EXPECT_EQ(r.status, 502);
  EXPECT_EQ(r.json()["error"]["code"], 502);
  EXPECT_NE(error_message(r).find("prefill"), std::string::npos) << r.body;
  EXPECT_TRUE(d.requests().empty());
}

// A prefill answering 500 yields a 502 naming the prefill stage.
TEST(PrefillFailure, ServerErrorIs502) {
  Sim p("prefill", {"--error-rate", "1"});
  Sim d("decode");
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  auto r = post_json(gw.port(), "/v1/chat/completions", stream_chat(3));
  EXPECT_EQ(r.status, 502);
  EXPECT_NE(error_message(r).find("prefill"), std::string::npos) << r.body;
  EXPECT_NE(error_message(r).find("500"), std::string::npos) << r.body;
  EXPECT_TRUE(d.requests().empty());
}

// A prefill that never answers is cut off by the first-byte timeout: 502.
TEST(PrefillFailure, TimeoutIs502) {
  Sim p("prefill", {"--hang"});
  Sim d("decode");
  Gateway gw(
      {"--prefill", p.hostport(), "--decode", d.hostport(), "--first-byte-timeout", "400ms"});
  const auto start = Clock::now();
  auto r = post_json(gw.port(), "/v1/completions", completion(false));
  EXPECT_EQ(r.status, 502);
  EXPECT_NE(error_message(r).find("prefill"), std::string::npos) << r.body;
  EXPECT_NE(error_message(r).find("timed out"), std::string::npos) << r.body;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(d.requests().empty());
}

// A listener whose accept queue is full: the kernel drops further SYNs, so
// a connect to it never completes (the stand-in for an unreachable host,
// without sending traffic anywhere but loopback).
class BlackholeListener {
 public:
  BlackholeListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(fd_, 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    for (int i = 0; i < 4; ++i) {
      int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a);
      fillers_.push_back(c);
    }
  }
  ~BlackholeListener() {
    for (int c : fillers_)
      close(c);
    close(fd_);
  }
  std::uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::vector<int> fillers_;
};

// A prefill that never completes the TCP handshake is cut off by the
// connect timeout: 502 naming the stage, well before the first-byte timeout.
TEST(PrefillFailure, ConnectTimeoutIs502) {
  BlackholeListener hole;
  Sim d("decode");
  Gateway gw({"--prefill", "127.0.0.1:" + std::to_string(hole.port()), "--decode", d.hostport(),
              "--connect-timeout", "300ms"});
  const auto start = Clock::now();
  auto r = post_json(gw.port(), "/v1/completions", completion(false));
  EXPECT_EQ(r.status, 502);
  EXPECT_NE(error_message(r).find("prefill"), std::string::npos) << r.body;
  EXPECT_NE(error_message(r).find("timed out"), std::string::npos) << r.body;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_TRUE(d.requests().empty());
}

// A decode answering 500 before any byte of the stream yields a 502 naming
// the decode stage.
TEST(DecodeFailure, ServerErrorBeforeFirstByteIs502) {
  Sim p("prefill");
  Sim d("decode", {"--error-rate", "1"});
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  auto r = post_json(gw.port(), "/v1/chat/completions", stream_chat(3));
  EXPECT_EQ(r.status, 502);
  EXPECT_NE(error_message(r).find("decode"), std::string::npos) << r.body;
}

// A decode that refuses connections yields a 502 naming the decode stage.
TEST(DecodeFailure, RefusedIs502) {
  Sim p("prefill");
  Gateway gw({"--prefill", p.hostport(), "--decode", "127.0.0.1:" + std::to_string(closed_port())});
  auto r = post_json(gw.port(), "/v1/completions", completion(true));
  EXPECT_EQ(r.status, 502);
  EXPECT_NE(error_message(r).find("decode"), std::string::npos) << r.body;
}

// A decode that dies mid-stream: the client gets the events sent so far,
// then an in-band error event, and the stream ends with no invented
// finish_reason and no [DONE].
TEST(DecodeFailure, DeathMidStreamGivesInBandError) {
  Sim p("prefill");
  Sim d("decode", {"--die-after-chunks", "3", "--itl-ms", "5"});
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  auto r = post_json(gw.port(), "/v1/chat/completions", stream_chat(20));
  ASSERT_EQ(r.status, 200);
  auto events = sse_data(r.body);
  ASSERT_EQ(events.size(), 4u) << r.body;
  for (int i = 0; i < 3; ++i) {
    auto e = Json::parse(events[i]);
    ASSERT_FALSE(e["choices"].empty());
    EXPECT_TRUE(e["choices"][0]["finish_reason"].is_null()) << events[i];
  }
  auto err = Json::parse(events[3]);
  ASSERT_TRUE(err.contains("error")) << events[3];
  EXPECT_EQ(err["error"]["code"], 502);
  EXPECT_NE(err["error"]["message"].get<std::string>().find("decode"), std::string::npos);
  EXPECT_EQ(r.body.find("[DONE]"), std::string::npos);
}

// A client that disconnects mid-stream: the decode engine sees its
// connection close within 100 ms, and in-flight counts return to zero.
TEST(ClientDisconnect, MidStreamClosesDecodeWithin100ms) {
  Sim p("prefill");
  Sim d("decode", {"--itl-ms", "50"});
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  Connection c(gw.port());
  c.send_request("POST", "/v1/chat/completions", stream_chat(200).dump());
  auto head = c.read_head();
  ASSERT_EQ(head.status, 200);
  std::string got;
  while (sse_data(got).size() < 2)
    got += c.read_body_some();
  const auto closed_at = now_ms();
  c.close();
  ASSERT_TRUE(eventually([&] {
    auto reqs = d.requests();
    return reqs.size() == 1 && reqs[0]["outcome"] == "aborted";
  })) << d.requests().dump();
  auto rec = d.requests()[0];
  EXPECT_LE(rec["ended_at_ms"].get<std::int64_t>() - closed_at, 100) << rec.dump();
  EXPECT_TRUE(eventually([&] {
    auto s = gw.status();
    return s["instances"]["decode"][0]["in_flight"] == 0 &&
           s["instances"]["prefill"][0]["in_flight"] == 0 &&
           s["active_requests"] == 1;  // the /status request itself
  }));
}

// A client that sends one byte more than its request (in the same write,
// or later) and then leaves while its whole (non-streamed) answer is
// being generated: the bytes wait for the next request, and the watch
// still sees the client go, so the engines stop generating (issue 32,
// item 7: before, 10 of 10 engines were still generating after 6 s).
TEST(ClientDisconnect, ExtraBytesAfterTheRequestDoNotHideTheLeaving) {
  Sim p("prefill");
  Sim d("decode", {"--itl-ms", "50"});
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  Json chat = stream_chat(200);
  chat["stream"] = false;  // nothing is written to the client for 10 s
  const std::string body = chat.dump();
  const std::string request =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  for (const bool same_write : {true, false}) {
    d.clear();
    Connection c(gw.port());
    c.send_raw(same_write ? request + "X" : request);
    ASSERT_TRUE(eventually([&] { return d.requests().size() == 1; }))
        << (same_write ? "same write" : "later");
    if (!same_write) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the watch has started
      c.send_raw("X");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto closed_at = now_ms();
    c.close();
    ASSERT_TRUE(eventually([&] {
      auto reqs = d.requests();
      return reqs.size() == 1 && reqs[0]["outcome"] == "aborted";
    })) << (same_write ? "same write: " : "later: ")
        << d.requests().dump();
    EXPECT_LE(d.requests()[0]["ended_at_ms"].get<std::int64_t>() - closed_at, 500)
        << d.requests().dump();
  }
}

// A client that disconnects while the prefill is still computing: the
// prefill connection is closed at once and nothing reaches the decode.
TEST(ClientDisconnect, DuringPrefillAbortsPrefill) {
  Sim p("prefill", {"--prefill-base-ms", "2000"});
  Sim d("decode");
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport()});
  {
    Connection c(gw.port());
    c.send_request("POST", "/v1/completions", completion(true).dump());
    ASSERT_TRUE(eventually([&] { return p.requests().size() == 1; }));
    c.close();
  }
  ASSERT_TRUE(eventually(
      [&] {
        auto reqs = p.requests();
        return reqs.size() == 1 && reqs[0]["outcome"] == "aborted";
      },
      std::chrono::seconds(1)))
      << p.requests().dump();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(d.requests().empty());
  EXPECT_EQ(gw.status()["active_requests"], 1);  // the /status request itself
}

// One bad request never affects another: a stream in progress completes
// while malformed, oversized and failing requests hit the same gateway.
TEST(Isolation, BadRequestsDoNotDisturbAStream) {
  Sim p("prefill");
  Sim d("decode", {"--itl-ms", "10"});
  Gateway gw({"--prefill", p.hostport(), "--decode", d.hostport(), "--max-body-size", "64KiB"});
  auto good = std::async(std::launch::async, [&] {
    return post_json(gw.port(), "/v1/chat/completions", stream_chat(40));
  });
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(http_request(gw.port(), "POST", "/v1/completions", "not json").status, 400);
    EXPECT_EQ(http_request(gw.port(), "POST", "/v1/completions", std::string(100000, '{')).status,
              413);
    Connection half(gw.port());
    half.send_raw("POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"mo");
    half.close();
    Json bad_model = completion(false);
    bad_model["model"] = "nope";
    EXPECT_EQ(post_json(gw.port(), "/v1/completions", bad_model).status, 404);
  }
  auto r = good.get();
  ASSERT_EQ(r.status, 200);
  auto events = sse_data(r.body);
  EXPECT_EQ(events.back(), "[DONE]");
}

}  // namespace
}  // namespace pdgate::test
