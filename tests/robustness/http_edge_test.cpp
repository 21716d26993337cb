// The client edge under attack (issue 12): request smuggling through
// Transfer-Encoding (defect 9), memory claimed by declared but unsent
// bodies (defect 4), and a second gateway stealing the port (defect 13).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "tests/integration/harness.hpp"
#include "tests/robustness/util.hpp"

namespace pdgate::test {
namespace {

using namespace std::chrono_literals;

const std::string kBody = R"({"model":"sim-model","prompt":"hi","max_tokens":2})";

// `body` as one chunk and the last chunk.
std::string chunked(const std::string& body) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx", body.size());
  return std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n";
}

// After an answer that closes the connection, reading another response
// must find the connection closed: nothing pdgate read after the refused
// header was served as a request of its own.
void expect_closed_without_more(Connection& c, const std::string& what) {
  try {
    auto extra = c.read_head(3s);
    ADD_FAILURE() << what << ": a second response was served: " << extra.status;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("closed"), std::string::npos)
        << what << ": connection left open (" << e.what() << ")";
  }
}

struct Pd {
  Sim p{"prefill"};
  Sim d{"decode"};
  std::vector<std::string> args() const {
    return {"--prefill", p.hostport(), "--decode", d.hostport()};
  }
};

// A Transfer-Encoding other than a single final "chunked" gets 400 (501
// for a coding pdgate does not decode) and the connection is closed; the
// bytes that followed the header never become a second request.
TEST(Smuggling, TransferCodingsOtherThanChunkedAreRefusedAndClose) {
  Pd pd;
  Gateway gw(pd.args());
  struct Case {
    std::string te;
    int status;
  };
  const std::string smuggled =
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Request-Id: SMUGGLED-1\r\n\r\n";
  for (const auto& c : {Case{"gzip", 400}, Case{"xchunked", 400}, Case{"chunked, identity", 400},
                        Case{"\"chunked\"", 400}, Case{"identity", 400}, Case{"gzip, chunked", 501},
                        Case{"chunked, chunked", 400}, Case{"chunked;x=1", 400}}) {
    Connection conn(gw.port());
    conn.send_raw(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: " +
        c.te + "\r\n\r\n" + smuggled);
    auto r = conn.read_response(5s);
    EXPECT_EQ(r.status, c.status) << c.te << ": " << r.body;
    EXPECT_EQ(r.header("connection"), "close") << c.te;
    EXPECT_NE(r.body.find("Transfer-Encoding"), std::string::npos) << r.body;
    expect_closed_without_more(conn, c.te);
  }
  EXPECT_TRUE(pd.d.requests().empty());
  EXPECT_TRUE(pd.p.requests().empty());
}

// Transfer-Encoding together with Content-Length, or in an HTTP/1.0
// request, is refused with 400 and the connection closed.
TEST(Smuggling, TransferEncodingWithContentLengthOrHttp10IsRefused) {
  Pd pd;
  Gateway gw(pd.args());
  const std::string chunked_body = chunked(kBody);
  for (const std::string head :
       {"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n",
        "POST /v1/completions HTTP/1.0\r\nHost: x\r\n"}) {
    Connection conn(gw.port());
    conn.send_raw(head + "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                  chunked_body);
    auto r = conn.read_response(5s);
    EXPECT_EQ(r.status, 400) << head << r.body;
    expect_closed_without_more(conn, head);
  }
  EXPECT_TRUE(pd.d.requests().empty());
}

// A folded header line (obs-fold), in Transfer-Encoding or any field, and
// an HTTP/1.1 request without exactly one Host are refused with 400 and
// the connection closed, as RFC 9112 says; HTTP/1.0 without Host is
// served (issue 32, item 18: before, both were accepted).
TEST(Smuggling, FoldedLinesAndMissingHostAreRefused) {
  Pd pd;
  Gateway gw(pd.args());
  const std::string type = "Content-Type: application/json\r\n";
  const std::string length = "Content-Length: " + std::to_string(kBody.size()) + "\r\n";
  struct Case {
    std::string what;
    std::string head;
    std::string body;
  };
  const Case cases[] = {
      {"folded Transfer-Encoding",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + type +
           "Transfer-Encoding: identity,\r\n chunked\r\n",
       chunked(kBody)},
      {"folded field",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + type + "X-Note: a\r\n\tb\r\n" + length,
       kBody},
      {"no Host", "POST /v1/completions HTTP/1.1\r\n" + type + length, kBody},
      {"two Host", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nHost: y\r\n" + type + length,
       kBody},
  };
  for (const auto& c : cases) {
    Connection conn(gw.port());
    conn.send_raw(c.head + "\r\n" + c.body);
    auto r = conn.read_response(5s);
    EXPECT_EQ(r.status, 400) << c.what << ": " << r.body;
    EXPECT_EQ(r.header("connection"), "close") << c.what;
    expect_closed_without_more(conn, c.what);
  }
  EXPECT_TRUE(pd.d.requests().empty());
  Connection conn(gw.port());
  conn.send_raw("POST /v1/completions HTTP/1.0\r\n" + type + length + "\r\n" + kBody);
  EXPECT_EQ(conn.read_response(10s).status, 200);
}

// A chunked body with a malformed chunk size gets a 400 answer (not a
// silent close); a well-formed one, in any letter case, is served.
TEST(Smuggling, BadChunkSizeIs400AndGoodChunkedBodyIsServed) {
  Pd pd;
  Gateway gw(pd.args());
  {
    Connection conn(gw.port());
    conn.send_raw(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\nzz\r\n" +
        kBody + "\r\n0\r\n\r\n");
    auto r = conn.read_response(5s);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("chunk"), std::string::npos) << r.body;
    expect_closed_without_more(conn, "bad chunk size");
  }
  {
    Connection conn(gw.port());
    conn.send_raw(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: Chunked\r\n\r\n" +
        chunked(kBody));
    auto r = conn.read_response(10s);
    EXPECT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(pd.d.requests().size(), 1u);
}

// 64 connections that each declare a 64 MiB body and send 10 bytes of it
// cost the gateway a few MiB, not 64 MiB each (the body grows as its bytes
// arrive).
TEST(BodyMemory, DeclaredLengthIsNotAllocatedUpFront) {
  Pd pd;
  Gateway gw(pd.args());
  const auto pid = gw.process().pid();
  const auto before = rss_kib(pid);
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < 64; ++i) {
    conns.push_back(std::make_unique<Connection>(gw.port()));
    conns.back()->send_raw(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 67108864\r\n\r\n{\"prompt\":");
  }
  std::this_thread::sleep_for(1s);
  const auto grown_mib = (rss_kib(pid) - before) / 1024;
  EXPECT_LT(grown_mib, 64) << "RSS grew by " << grown_mib << " MiB";
  // The gateway still serves others meanwhile.
  EXPECT_EQ(http_request(gw.port(), "POST", "/v1/completions", kBody).status, 200);
}

// Bodies being received share one memory budget: past it a large body is
// refused with 503 and Retry-After, counted, while small requests are
// still served and the RSS stays bounded.
TEST(BodyMemory, GlobalBudgetRefusesLargeBodiesPastIt) {
  Pd pd;
  Gateway gw([&] {
    auto a = pd.args();
    a.insert(a.end(), {"--body-memory-limit", "8MiB", "--max-body-size", "32MiB"});
    return a;
  }());
  const auto pid = gw.process().pid();
  const auto before = rss_kib(pid);
  const std::string piece(1 << 20, 'a');
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < 6; ++i) {
    conns.push_back(std::make_unique<Connection>(gw.port()));
    conns.back()->send_raw(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 16777216\r\n\r\n");
  }
  // Three MiB on each, in turn: together far past the budget.
  int refused = 0;
  for (int round = 0; round < 3; ++round) {
    for (auto& c : conns) {
      try {
        c->send_raw(piece);
      } catch (const std::exception&) {
      }
    }
  }
  for (auto& c : conns) {
    try {
      auto r = c->read_response(2s);
      EXPECT_EQ(r.status, 503) << r.body;
      EXPECT_FALSE(r.header("retry-after").empty());
      ++refused;
    } catch (const std::exception&) {
      // Still receiving: within the budget.
    }
  }
  EXPECT_GE(refused, 1);
  EXPECT_GE(metric(gw.port(), "pdgate_body_memory_refusals_total"), refused);
  EXPECT_EQ(http_request(gw.port(), "POST", "/v1/completions", kBody).status, 200);
  EXPECT_LT((rss_kib(pid) - before) / 1024, 48);
}

// A second pdgate started on the port a first one listens on fails with
// "address in use" (exit status 1) instead of taking a share of its
// traffic; the first keeps serving.
TEST(Listener, SecondGatewayOnATakenPortFails) {
  Pd pd;
  Gateway first(pd.args());
  auto args =
      std::vector<std::string>{build_dir() + "/pdgate",      "--host",    "127.0.0.1", "--port",
                               std::to_string(first.port()), "--workers", "2"};
  for (const auto& a : pd.args())
    args.push_back(a);
  Process second("pdgate-second", args);
  const int status = second.wait(10s);
  ASSERT_NE(status, -1) << "the second gateway is running on a taken port";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_NE(second.log().find("in use"), std::string::npos) << second.log();
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(http_request(first.port(), "POST", "/v1/completions", kBody).status, 200);
}

}  // namespace
}  // namespace pdgate::test
