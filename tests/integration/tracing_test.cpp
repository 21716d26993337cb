// Trace context and forwarded headers end to end: real pdgate in front of
// pdgate-sim encode, prefill and decode engines, an OTLP receiver in the
// test process. Checks what the engines received (their request logs) and
// what the receiver got, against each other.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <map>
#include <regex>
#include <set>

#include "tests/integration/harness.hpp"
#include "tests/integration/otlp_receiver.hpp"

namespace pdgate::test {
namespace {

const std::string kClientTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
const std::string kClientSpan = "00f067aa0ba902b7";
const std::string kClientParent = "00-" + kClientTrace + "-" + kClientSpan + "-01";

const std::string kImage =
    R"({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}})";

std::string chat_body(bool with_image, bool stream = false) {
  return R"({"model": "sim-model", "messages": [{"role": "user", "content": [)"
         R"({"type": "text", "text": "What is this?"})" +
         std::string(with_image ? ", " + kImage : "") + R"(]}], "max_tokens": 4, "stream": )" +
         (stream ? "true" : "false") + "}";
}

Response chat(std::uint16_t port, const std::string& body, Headers extra = {}) {
  extra.emplace_back("Content-Type", "application/json");
  return http_request(port, "POST", "/v1/chat/completions", body, extra);
}

// The parts of a traceparent header: trace id, parent id, flags.
struct Parent {
  std::string trace, span, flags;
};

Parent split(const std::string& header) {
  static const std::regex re("00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})");
  std::smatch m;
  if (!std::regex_match(header, m, re))
    return {};
  return {m[1], m[2], m[3]};
}

// The one request `sim` logged with X-Request-Id `rid` (encoder children
// carry "rid:i:xxxxxx"), or the last one when rid is empty.
std::vector<Json> logged(Sim& sim, const std::string& rid) {
  std::vector<Json> out;
  for (auto& r : sim.requests()) {
    const std::string id =
        r["x_request_id"].is_string() ? r["x_request_id"].get<std::string>() : "";
    if (id == rid || id.starts_with(rid + ":"))
      out.push_back(r);
  }
  return out;
}

std::string header_of(const Json& record, const std::string& name) {
  const auto& h = record.at("headers");
  return h.contains(name) ? h.at(name).get<std::string>() : std::string();
}

std::string attribute(const Json& span, const std::string& key) {
  for (const auto& a : span.at("attributes")) {
    if (a.at("key") == key) {
      const auto& v = a.at("value");
      return v.contains("stringValue") ? v.at("stringValue").get<std::string>()
                                       : v.at("intValue").get<std::string>();
    }
  }
  return "";
}

std::int64_t counter(std::uint16_t port, const std::string& series) {
  const std::string text = get(port, "/metrics").body;
  const std::size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos)
    return -1;
  return std::stoll(text.substr(at + series.size() + 2));
}

class Tracing : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    receiver = new OtlpReceiver();
    e = new Sim("encode");
    p = new Sim("prefill");
    d = new Sim("decode");
    traced = new Gateway({"--encode-servers-urls", e->url(), "--prefill-servers-urls", p->url(),
                          "--decode-servers-urls", d->url(), "--otlp-endpoint", receiver->url(),
                          "--otlp-export-interval", "50ms"});
    untraced = new Gateway({"--encode-servers-urls", e->url(), "--prefill-servers-urls", p->url(),
                            "--decode-servers-urls", d->url()});
  }
  static void TearDownTestSuite() {
    delete traced;
    delete untraced;
    delete e;
    delete p;
    delete d;
    delete receiver;
  }
  static inline OtlpReceiver* receiver = nullptr;
  static inline Sim* e = nullptr;
  static inline Sim* p = nullptr;
  static inline Sim* d = nullptr;
  static inline Gateway* traced = nullptr;
  static inline Gateway* untraced = nullptr;
};

// A client's traceparent through E -> P -> D with an exporter: each engine
// gets the client's trace id with a parent of its own (not the client's),
// tracestate and baggage unchanged; the receiver gets one server span
// (child of the client's span) and one client span per engine call, whose
// ids are the parents the engines saw.
TEST_F(Tracing, EnginesGetTheClientsTraceWithTheirOwnParent) {
  const std::string rid = "trace-epd-1";
  auto r = chat(traced->port(), chat_body(true),
                {{"X-Request-Id", rid},
                 {"traceparent", kClientParent},
                 {"tracestate", "vendor=abc,other=1"},
                 {"baggage", "user=alice"}});
  ASSERT_EQ(r.status, 200) << r.body;
  std::map<std::string, std::string> parent_of_stage;  // stage -> parent id the engine saw
  for (auto [stage, sim] :
       {std::pair{"encode", e}, std::pair{"prefill", p}, std::pair{"decode", d}}) {
    const auto got = logged(*sim, rid);
    ASSERT_EQ(got.size(), 1u) << stage;
    const Parent tp = split(header_of(got[0], "traceparent"));
    EXPECT_EQ(tp.trace, kClientTrace) << stage << ": " << header_of(got[0], "traceparent");
    EXPECT_NE(tp.span, kClientSpan) << stage;
    EXPECT_EQ(tp.flags, "01") << stage;
    EXPECT_EQ(header_of(got[0], "tracestate"), "vendor=abc,other=1") << stage;
    EXPECT_EQ(header_of(got[0], "baggage"), "user=alice") << stage;
    parent_of_stage[stage] = tp.span;
  }
  EXPECT_EQ(std::set<std::string>(
                {parent_of_stage["encode"], parent_of_stage["prefill"], parent_of_stage["decode"]})
                .size(),
            3u);

  std::vector<Json> spans;
  ASSERT_TRUE(eventually([&] {
    spans = receiver->trace(kClientTrace);
    return spans.size() >= 4;
  })) << spans.size();
  std::vector<Json> servers;
  std::map<std::string, Json> clients;  // by stage
  for (const auto& s : spans) {
    if (s.at("kind") == 2)
      servers.push_back(s);
    else
      clients[attribute(s, "pdgate.stage")] = s;
  }
  ASSERT_EQ(servers.size(), 1u);
  ASSERT_EQ(clients.size(), 3u);
  const Json& server = servers[0];
  EXPECT_EQ(server.at("parentSpanId"), kClientSpan);
  EXPECT_EQ(server.at("name"), "POST /v1/chat/completions");
  EXPECT_EQ(attribute(server, "http.response.status_code"), "200");
  EXPECT_EQ(attribute(server, "pdgate.request_id"), rid);
  EXPECT_EQ(server.at("traceState"), "vendor=abc,other=1");
  for (auto [stage, sim] :
       {std::pair{"encode", e}, std::pair{"prefill", p}, std::pair{"decode", d}}) {
    const Json& c = clients[stage];
    EXPECT_EQ(c.at("spanId"), parent_of_stage[stage]) << stage;
    EXPECT_EQ(c.at("parentSpanId"), server.at("spanId")) << stage;
    EXPECT_EQ(attribute(c, "url.full"), sim->url()) << stage;
    EXPECT_EQ(attribute(c, "http.response.status_code"), "200") << stage;
    EXPECT_EQ(attribute(c, "pdgate.retry"), "0") << stage;
    EXPECT_FALSE(c.contains("status")) << stage;
    EXPECT_LE(std::stoull(server.at("startTimeUnixNano").get<std::string>()),
              std::stoull(c.at("startTimeUnixNano").get<std::string>()));
    EXPECT_GE(std::stoull(server.at("endTimeUnixNano").get<std::string>()),
              std::stoull(c.at("endTimeUnixNano").get<std::string>()));
  }
  // Token counts from the whole answers' usage (the decode's is whole here).
  EXPECT_FALSE(attribute(clients["prefill"], "gen_ai.usage.input_tokens").empty());
  EXPECT_EQ(attribute(clients["decode"], "gen_ai.usage.output_tokens"),
            std::to_string(r.json()["usage"]["completion_tokens"].get<int>()));
}

// No traceparent from the client: a new trace, the same on every stage,
// sampled (ratio 1), and exported as one trace whose server span is a root.
TEST_F(Tracing, RequestWithoutTraceparentStartsOneTrace) {
  const std::string rid = "trace-new-1";
  ASSERT_EQ(chat(traced->port(), chat_body(true), {{"X-Request-Id", rid}}).status, 200);
  std::set<std::string> traces, parents;
  for (Sim* sim : {e, p, d}) {
    const auto got = logged(*sim, rid);
    ASSERT_EQ(got.size(), 1u);
    const Parent tp = split(header_of(got[0], "traceparent"));
    ASSERT_FALSE(tp.trace.empty()) << header_of(got[0], "traceparent");
    EXPECT_EQ(tp.flags, "01");
    traces.insert(tp.trace);
    parents.insert(tp.span);
  }
  ASSERT_EQ(traces.size(), 1u);
  EXPECT_EQ(parents.size(), 3u);
  std::vector<Json> spans;
  ASSERT_TRUE(eventually([&] {
    spans = receiver->trace(*traces.begin());
    return spans.size() >= 4;
  }));
  EXPECT_EQ(spans.size(), 4u);
  for (const auto& s : spans) {
    if (s.at("kind") == 2)
      EXPECT_FALSE(s.contains("parentSpanId"));
    else
      EXPECT_TRUE(parents.count(s.at("spanId").get<std::string>())) << s.dump();
  }
}

// Several requests: one trace each, each with its server span and one
// span per stage; the exported counter counts them all.
TEST_F(Tracing, OneTracePerRequest) {
  std::set<std::string> traces;
  for (int i = 0; i < 5; ++i) {
    const std::string rid = "trace-many-" + std::to_string(i);
    ASSERT_EQ(chat(traced->port(), chat_body(false, i % 2 == 1), {{"X-Request-Id", rid}}).status,
              200);
    traces.insert(split(header_of(logged(*d, rid).at(0), "traceparent")).trace);
  }
  ASSERT_EQ(traces.size(), 5u);
  for (const auto& t : traces) {
    std::vector<Json> spans;
    ASSERT_TRUE(eventually([&] {
      spans = receiver->trace(t);
      return spans.size() >= 3;
    }));
    std::multiset<std::string> names;
    for (const auto& s : spans)
      names.insert(s.at("name").get<std::string>());
    EXPECT_EQ(names,
              (std::multiset<std::string>{"POST /v1/chat/completions", "prefill", "decode"}));
  }
  EXPECT_TRUE(eventually(
      [&] { return counter(traced->port(), "pdgate_trace_spans_exported_total") >= 15; }));
}

// Without --otlp-endpoint pdgate is not a participant: the engines get the
// client's traceparent as sent; without one, a new trace's, the same on
// every stage (so the engines' own spans still join up). GET /v1/models
// carries it too.
TEST_F(Tracing, WithoutExporterTheContextPassesUnchanged) {
  const std::string rid = "trace-off-1";
  ASSERT_EQ(chat(untraced->port(), chat_body(true),
                 {{"X-Request-Id", rid}, {"traceparent", kClientParent}, {"tracestate", "a=1"}})
                .status,
            200);
  for (Sim* sim : {e, p, d}) {
    const auto got = logged(*sim, rid);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(header_of(got[0], "traceparent"), kClientParent);
    EXPECT_EQ(header_of(got[0], "tracestate"), "a=1");
  }
  const std::string rid2 = "trace-off-2";
  // An invalid traceparent (uppercase) is ignored and its tracestate dropped.
  ASSERT_EQ(chat(untraced->port(), chat_body(true),
                 {{"X-Request-Id", rid2},
                  {"traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"},
                  {"tracestate", "a=1"}})
                .status,
            200);
  std::set<std::string> seen;
  for (Sim* sim : {e, p, d}) {
    const auto got = logged(*sim, rid2);
    ASSERT_EQ(got.size(), 1u);
    const std::string tp = header_of(got[0], "traceparent");
    EXPECT_FALSE(split(tp).trace.empty()) << tp;
    EXPECT_NE(split(tp).trace, kClientTrace);
    EXPECT_EQ(header_of(got[0], "tracestate"), "");
    seen.insert(tp);
  }
  EXPECT_EQ(seen.size(), 1u);
  d->clear();
  ASSERT_EQ(
      http_request(untraced->port(), "GET", "/v1/models", "", {{"traceparent", kClientParent}})
          .status,
      200);
  const Json all = get(d->port(), "/sim/requests").json();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(header_of(all.back(), "traceparent"), kClientParent);
}

// A receiver that is down, or one that accepts and never answers: every
// request still succeeds well inside the export timeout (the exporter is
// off the data path), and the spans lost are counted by reason.
TEST(TracingReceiver, DownOrStalledCostsTheRequestsNothing) {
  Sim p("prefill");
  Sim d("decode");
  OtlpReceiver stalled(OtlpReceiver::Mode::stall);
  Gateway to_closed({"--prefill", p.hostport(), "--decode", d.hostport(), "--otlp-endpoint",
                     "http://127.0.0.1:" + std::to_string(closed_port()), "--otlp-export-interval",
                     "50ms", "--otlp-timeout", "20s"});
  Gateway to_stalled({"--prefill", p.hostport(), "--decode", d.hostport(), "--otlp-endpoint",
                      stalled.url(), "--otlp-export-interval", "50ms", "--otlp-timeout", "20s",
                      "--otlp-queue-size", "8", "--otlp-batch-size", "4"});
  for (Gateway* g : {&to_closed, &to_stalled}) {
    for (int i = 0; i < 20; ++i) {
      const auto started = Clock::now();
      const auto r = chat(g->port(), chat_body(false, i % 2 == 0));
      ASSERT_EQ(r.status, 200) << r.body;
      // An export waits up to 20 s for the receiver; a request must not.
      EXPECT_LT(Clock::now() - started, std::chrono::seconds(5));
    }
  }
  EXPECT_TRUE(eventually(
      [&] {
        return counter(to_closed.port(),
                       "pdgate_trace_spans_dropped_total{reason=\"export_failed\"}") > 0;
      },
      std::chrono::seconds(10)));
  EXPECT_EQ(counter(to_closed.port(), "pdgate_trace_spans_exported_total"), 0);
  // 20 requests x 3 spans into a queue of 8 that cannot drain.
  EXPECT_GT(counter(to_stalled.port(), "pdgate_trace_spans_dropped_total{reason=\"queue_full\"}"),
            0);
  EXPECT_GE(stalled.requests(), 1u);
  // Shutting down does not wait out the 20 s export timeout either.
  const auto stopping = Clock::now();
  to_stalled.process().signal(SIGTERM);
  EXPECT_NE(to_stalled.process().wait(std::chrono::seconds(10)), -1);
  EXPECT_LT(Clock::now() - stopping, std::chrono::seconds(10));
}

// A prefill that fails and is retried elsewhere: two prefill spans in the
// trace, the first with the engine's 500 and its error kind (retry 0), the
// second successful with retry 1; a decode stream that breaks off
// mid-relay ends its span as an error. (X-Sim-Fault reaches the decode
// through --forward-headers.)
TEST(TracingFailures, RetriesAndBrokenStreamsAreInTheSpans) {
  OtlpReceiver receiver;
  Sim bad("prefill", {"--error-rate", "1"});
  Sim good("prefill");
  Sim d("decode");
  Gateway g({"--prefill", bad.hostport(), good.hostport(), "--decode", d.hostport(),
             "--otlp-endpoint", receiver.url(), "--otlp-export-interval", "50ms",
             "--forward-headers", "x-sim-fault", "--eject-after", "100"});
  // Round-robin over two prefills: at least one of two requests starts on
  // the bad one.
  std::vector<std::string> traces;
  for (int i = 0; i < 2; ++i) {
    const std::string rid = "retry-" + std::to_string(i);
    ASSERT_EQ(chat(g.port(), chat_body(false), {{"X-Request-Id", rid}}).status, 200);
    traces.push_back(split(header_of(logged(d, rid).at(0), "traceparent")).trace);
  }
  int retried = 0;
  for (const auto& t : traces) {
    std::vector<Json> prefills;
    ASSERT_TRUE(eventually([&] {
      prefills.clear();
      const auto spans = receiver.trace(t);
      for (const auto& s : spans) {
        if (s.at("name") == "prefill")
          prefills.push_back(s);
      }
      return spans.size() >= 3 && spans.size() == prefills.size() + 2;
    }));
    if (prefills.size() == 1)
      continue;
    ++retried;
    ASSERT_EQ(prefills.size(), 2u);
    std::sort(prefills.begin(), prefills.end(), [](const Json& a, const Json& b) {
      return attribute(a, "pdgate.retry") < attribute(b, "pdgate.retry");
    });
    EXPECT_EQ(attribute(prefills[0], "pdgate.retry"), "0");
    EXPECT_EQ(attribute(prefills[0], "url.full"), bad.url());
    EXPECT_EQ(attribute(prefills[0], "http.response.status_code"), "500");
    EXPECT_EQ(attribute(prefills[0], "error.type"), "engine_failed");
    EXPECT_EQ(prefills[0].at("status").at("code"), 2);
    EXPECT_EQ(attribute(prefills[1], "pdgate.retry"), "1");
    EXPECT_EQ(attribute(prefills[1], "url.full"), good.url());
    EXPECT_FALSE(prefills[1].contains("status"));
  }
  EXPECT_GE(retried, 1);

  // The stream breaks after 3 data events: the client got a 200 header.
  const std::string rid = "broken-stream";
  auto r = chat(g.port(), chat_body(false, true),
                {{"X-Request-Id", rid}, {"X-Sim-Fault", "die-after=3"}});
  ASSERT_EQ(r.status, 200);
  const std::string trace = split(header_of(logged(d, rid).at(0), "traceparent")).trace;
  Json decode;
  ASSERT_TRUE(eventually([&] {
    for (const auto& s : receiver.trace(trace)) {
      if (s.at("name") == "decode")
        decode = s;
    }
    return !decode.is_null();
  }));
  EXPECT_EQ(decode.at("status").at("code"), 2) << decode.dump();
  EXPECT_EQ(attribute(decode, "error.type"), "connection_closed") << decode.dump();
}

// A stream resumed on another decode (docs/resumption.md): the resumed
// leg's prefill and decode are spans of the request's own trace, beside
// the broken decode's span, which ends as an error; the engines of the
// resumed leg get the same trace in their traceparent.
TEST(TracingFailures, ResumedLegIsInTheSameTrace) {
  OtlpReceiver receiver;
  Sim p("prefill");
  Sim dying("decode", {"--die-after-chunks", "3"});
  Sim healthy("decode");
  Gateway g({"--prefill", p.hostport(), "--decode", dying.hostport(), healthy.hostport(),
             "--otlp-endpoint", receiver.url(), "--otlp-export-interval", "50ms"});
  // Round-robin: one of two requests starts on the dying decode.
  std::string trace;
  for (int i = 0; i < 2 && trace.empty(); ++i) {
    const std::string rid = "resumed-" + std::to_string(i);
    auto r = chat(g.port(), chat_body(false, true), {{"X-Request-Id", rid}});
    ASSERT_EQ(r.status, 200);
    ASSERT_NE(r.body.find("[DONE]"), std::string::npos) << r.body;
    if (!logged(dying, rid).empty())
      trace = split(header_of(logged(dying, rid).at(0), "traceparent")).trace;
  }
  ASSERT_FALSE(trace.empty());
  std::vector<Json> decodes, prefills;
  ASSERT_TRUE(eventually([&] {
    decodes.clear();
    prefills.clear();
    for (const auto& s : receiver.trace(trace)) {
      if (s.at("name") == "decode")
        decodes.push_back(s);
      if (s.at("name") == "prefill")
        prefills.push_back(s);
    }
    return decodes.size() == 2 && prefills.size() == 2;
  })) << decodes.size()
      << " decode spans, " << prefills.size() << " prefill spans";
  int failed = 0;
  for (const auto& d : decodes) {
    if (attribute(d, "url.full") == dying.url()) {
      ++failed;
      EXPECT_EQ(d.at("status").at("code"), 2) << d.dump();
    } else {
      EXPECT_EQ(attribute(d, "url.full"), healthy.url());
      EXPECT_FALSE(d.contains("status")) << d.dump();
    }
  }
  EXPECT_EQ(failed, 1);
  // The resumed leg's engines carried the same trace.
  bool resumed_leg_traced = false;
  for (const auto& rec : healthy.requests()) {
    const std::string id = rec.value("request_id", "");
    if (id.ends_with("-r1"))
      resumed_leg_traced = split(header_of(rec, "traceparent")).trace == trace;
  }
  EXPECT_TRUE(resumed_leg_traced);
}

// X-Forwarded-For is appended to the client's, Forwarded names the peer,
// the headers --forward-headers lists reach the engines when sent (others
// do not), and --set-header's reach every stage.
TEST(ForwardedHeaders, ReachTheEngines) {
  Sim p("prefill");
  Sim d("decode");
  Gateway g({"--prefill", p.hostport(), "--decode", d.hostport(), "--forward-headers",
             "X-Tenant-Id,x-priority", "--set-header", "X-Cluster: eu-1", "--set-header",
             "X-Team: infra"});
  const std::string rid = "fwd-1";
  ASSERT_EQ(chat(g.port(), chat_body(false),
                 {{"X-Request-Id", rid},
                  {"X-Forwarded-For", "10.1.1.1"},
                  {"Forwarded", "for=10.1.1.1;proto=https"},
                  {"X-Tenant-Id", "acme"},
                  {"X-Other", "not-listed"}})
                .status,
            200);
  for (Sim* sim : {&p, &d}) {
    const auto got = logged(*sim, rid);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(header_of(got[0], "x-forwarded-for"), "10.1.1.1, 127.0.0.1");
    EXPECT_EQ(header_of(got[0], "forwarded"), "for=10.1.1.1;proto=https, for=127.0.0.1;proto=http");
    EXPECT_EQ(header_of(got[0], "x-tenant-id"), "acme");
    EXPECT_EQ(header_of(got[0], "x-priority"), "");
    EXPECT_EQ(header_of(got[0], "x-other"), "");
    EXPECT_EQ(header_of(got[0], "x-cluster"), "eu-1");
    EXPECT_EQ(header_of(got[0], "x-team"), "infra");
  }
  // A client without X-Forwarded-For: the peer alone.
  ASSERT_EQ(chat(g.port(), chat_body(false), {{"X-Request-Id", "fwd-2"}}).status, 200);
  EXPECT_EQ(header_of(logged(d, "fwd-2").at(0), "x-forwarded-for"), "127.0.0.1");
  EXPECT_EQ(header_of(logged(d, "fwd-2").at(0), "forwarded"), "for=127.0.0.1;proto=http");
}

// A forbidden header in the configuration stops pdgate at start-up with a
// message naming it (exit 2), flag or YAML alike.
TEST(ForwardedHeaders, ForbiddenHeaderRefusedAtStart) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--set-header", "Transfer-Encoding: chunked"},
        std::vector<std::string>{"--forward-headers", "connection"}}) {
    std::vector<std::string> argv{build_dir() + "/pdgate", "--port",   "0",          "--prefill",
                                  "127.0.0.1:1",           "--decode", "127.0.0.1:2"};
    argv.insert(argv.end(), args.begin(), args.end());
    Process bad("pdgate", argv);
    const int st = bad.wait();
    ASSERT_NE(st, -1);
    EXPECT_EQ(WEXITSTATUS(st), 2);
    EXPECT_NE(bad.log().find("hop-by-hop"), std::string::npos) << bad.log();
  }
}

}  // namespace
}  // namespace pdgate::test
