#include "core/observability/tracing.hpp"

#include <gtest/gtest.h>

#include <boost/beast/http/fields.hpp>

namespace pdgate {
namespace {

// Keeps what it is given: the sink interface's simplest implementation.
class CollectingSink final : public SpanSink {
 public:
  void submit(Span&& span) override { spans.push_back(std::move(span)); }
  SpanStats stats() const override { return {}; }
  std::vector<Span> spans;
};

constexpr const char* kSampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
constexpr const char* kUnsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";

boost::beast::http::fields headers(std::initializer_list<std::pair<const char*, const char*>> h) {
  boost::beast::http::fields f;
  for (const auto& [k, v] : h)
    f.insert(k, v);
  return f;
}

// A sampled client trace with a sink: a server span under the client's
// span, a stage span under the server span whose id the engine's
// traceparent names; both handed over when they end, stage first.
TEST(RequestTrace, SampledClientTraceMakesServerAndStageSpans) {
  CollectingSink sink;
  TraceIdSource ids(7);
  {
    RequestTrace trace(ids, &sink, 0.0,
                       headers({{"traceparent", kSampled}, {"tracestate", "a=1"}}));
    ASSERT_TRUE(trace.recording());
    trace.name("POST /v1/completions");
    StageSpan s = trace.stage("prefill", "http://p:1", 2);
    const auto tp = parse_traceparent(s.traceparent());
    ASSERT_TRUE(tp);
    EXPECT_EQ(to_hex(tp->trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    EXPECT_TRUE(tp->sampled());
    s.status(503);
    s.error("engine_failed", "prefill stage failed");
    s.end();
    ASSERT_EQ(sink.spans.size(), 1u);
    EXPECT_EQ(sink.spans[0].span_id, tp->parent_id);
    trace.finish(200, "decode");
  }
  ASSERT_EQ(sink.spans.size(), 2u);
  const Span& stage = sink.spans[0];
  const Span& server = sink.spans[1];
  EXPECT_EQ(to_hex(server.parent_id), "00f067aa0ba902b7");
  EXPECT_EQ(stage.parent_id, server.span_id);
  EXPECT_EQ(server.kind, SpanKind::server);
  EXPECT_EQ(stage.kind, SpanKind::client);
  EXPECT_EQ(server.trace_state, "a=1");
  EXPECT_TRUE(stage.error);
  EXPECT_FALSE(server.error);
  EXPECT_LE(server.start_ns, stage.start_ns);
  EXPECT_GE(server.end_ns, stage.end_ns);
}

// The client's unsampled flag is followed: nothing is exported, but each
// engine call still gets a parent of its own, flag 00.
TEST(RequestTrace, UnsampledClientTraceExportsNothing) {
  CollectingSink sink;
  TraceIdSource ids(7);
  {
    RequestTrace trace(ids, &sink, 1.0, headers({{"traceparent", kUnsampled}}));
    EXPECT_FALSE(trace.recording());
    StageSpan a = trace.stage("prefill", "http://p:1", 0);
    StageSpan b = trace.stage("decode", "http://d:1", 0);
    EXPECT_NE(a.traceparent(), b.traceparent());
    EXPECT_FALSE(parse_traceparent(a.traceparent())->sampled());
    EXPECT_NE(to_hex(parse_traceparent(a.traceparent())->parent_id), "00f067aa0ba902b7");
  }
  EXPECT_TRUE(sink.spans.empty());
}

// A trace pdgate starts follows --trace-sample-ratio: 0 samples nothing.
TEST(RequestTrace, NewTraceFollowsTheRatio) {
  CollectingSink sink;
  TraceIdSource ids(7);
  {
    RequestTrace none(ids, &sink, 0.0, headers({}));
    EXPECT_FALSE(none.recording());
    EXPECT_FALSE(parse_traceparent(none.traceparent())->sampled());
    RequestTrace all(ids, &sink, 1.0, headers({{"traceparent", "garbage"}, {"tracestate", "a=1"}}));
    EXPECT_TRUE(all.recording());
    EXPECT_TRUE(all.tracestate().empty());  // dropped with the invalid traceparent
  }
  ASSERT_EQ(sink.spans.size(), 1u);
  EXPECT_TRUE(is_zero(sink.spans[0].parent_id));
}

// Without a sink pdgate is not a participant: the client's header is
// passed on as sent, to every stage alike; a 499 (client gone) is not
// reported as a span either.
TEST(RequestTrace, WithoutSinkTheClientsHeaderPassesUnchanged) {
  TraceIdSource ids(7);
  RequestTrace trace(ids, nullptr, 1.0,
                     headers({{"traceparent", kSampled}, {"baggage", "user=alice"}}));
  EXPECT_FALSE(trace.recording());
  EXPECT_EQ(trace.traceparent(), kSampled);
  EXPECT_EQ(trace.stage("decode", "http://d:1", 0).traceparent(), kSampled);
  EXPECT_EQ(trace.baggage(), "user=alice");
  trace.finish(0, "decode");
}

// A client that left (status 0) makes the server span an error with 499.
TEST(RequestTrace, ClientGoneIs499) {
  CollectingSink sink;
  TraceIdSource ids(7);
  {
    RequestTrace trace(ids, &sink, 1.0, headers({}));
    trace.finish(0, "decode");
  }
  ASSERT_EQ(sink.spans.size(), 1u);
  EXPECT_TRUE(sink.spans[0].error);
  bool found = false;
  for (const auto& a : sink.spans[0].attributes) {
    if (a.key == "http.response.status_code") {
      EXPECT_EQ(std::get<std::int64_t>(a.value), 499);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace pdgate
