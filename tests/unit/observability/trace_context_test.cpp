#include "core/observability/trace_context.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace pdgate {
namespace {

constexpr const char* kValid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// A version-00 header: its ids and flags are read as sent.
TEST(TraceParent, ParsesVersion00) {
  const auto p = parse_traceparent(kValid);
  ASSERT_TRUE(p);
  EXPECT_EQ(to_hex(p->trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(to_hex(p->parent_id), "00f067aa0ba902b7");
  EXPECT_TRUE(p->sampled());
  EXPECT_FALSE(
      parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")->sampled());
}

// Every malformed header the spec names is refused (a new trace starts).
TEST(TraceParent, RefusesMalformed) {
  const char* bad[] = {
      "",
      "00",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",     // short flags
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",   // 00 has no more fields
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",   // too long for 00
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // uppercase
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // zero trace id
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // zero parent id
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // version ff
      "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // not hex
      "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // wrong separator
      "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",    // misplaced dash
      " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // leading space
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",    // flags not hex
      "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.x",  // future version, no dash
  };
  for (const char* b : bad)
    EXPECT_FALSE(parse_traceparent(b)) << b;
}

// A future version is read by its version-00 prefix, extra fields ignored.
TEST(TraceParent, ReadsFutureVersionsByTheirPrefix) {
  const auto p =
      parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever");
  ASSERT_TRUE(p);
  EXPECT_EQ(to_hex(p->parent_id), "00f067aa0ba902b7");
  EXPECT_TRUE(parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
}

// What pdgate sends is version 00 and parses back to the same ids.
TEST(TraceParent, FormatRoundTrips) {
  const auto p = parse_traceparent(kValid);
  ASSERT_TRUE(p);
  EXPECT_EQ(format_traceparent(p->trace_id, p->parent_id, true), kValid);
  const std::string unsampled = format_traceparent(p->trace_id, p->parent_id, false);
  EXPECT_EQ(unsampled.size(), kTraceParentLength);
  EXPECT_FALSE(parse_traceparent(unsampled)->sampled());
}

// tracestate: kept when short, cut at a member boundary when long,
// dropped when it holds a control character.
TEST(TraceState, BoundedAtMemberBoundaries) {
  EXPECT_EQ(*bounded_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
            "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
  std::string longer;
  for (int i = 0; longer.size() < 2 * kMaxTraceState; ++i)
    longer += (i ? "," : "") + std::string("k") + std::to_string(i) + "=0123456789abcdef";
  const auto cut = bounded_tracestate(longer);
  ASSERT_TRUE(cut);
  EXPECT_LE(cut->size(), kMaxTraceState);
  EXPECT_GT(cut->size(), kMaxTraceState - 40);
  EXPECT_EQ(longer.substr(0, cut->size()), *cut);
  EXPECT_EQ(longer[cut->size()], ',');
  EXPECT_FALSE(bounded_tracestate("a=b\r\nx-evil: 1"));
  EXPECT_EQ(*bounded_tracestate(std::string(kMaxTraceState + 1, 'a')), "");
}

// baggage: kept whole up to its 8 KiB limit, dropped beyond or when it
// holds a control or non-ASCII byte.
TEST(Baggage, KeptWholeOrDropped) {
  EXPECT_EQ(*bounded_baggage("userId=alice,serverNode=DF%2028"), "userId=alice,serverNode=DF%2028");
  EXPECT_TRUE(bounded_baggage(std::string(kMaxBaggage, 'a')));
  EXPECT_FALSE(bounded_baggage(std::string(kMaxBaggage + 1, 'a')));
  EXPECT_FALSE(bounded_baggage("a=b\nc=d"));
  EXPECT_FALSE(bounded_baggage("a=\xc3\xa9"));
}

// Ratio sampling: 0 never, 1 always, 0.25 about a quarter of random ids,
// and the same id always gets the same answer.
TEST(Sampling, FollowsTheRatio) {
  TraceIdSource ids(42);
  int sampled = 0;
  for (int i = 0; i < 4000; ++i) {
    const TraceId id = ids.trace_id();
    EXPECT_FALSE(sampled_at_ratio(id, 0.0));
    EXPECT_TRUE(sampled_at_ratio(id, 1.0));
    EXPECT_EQ(sampled_at_ratio(id, 0.25), sampled_at_ratio(id, 0.25));
    sampled += sampled_at_ratio(id, 0.25) ? 1 : 0;
  }
  EXPECT_GT(sampled, 800);
  EXPECT_LT(sampled, 1200);
}

// Ids are never zero and do not repeat.
TEST(TraceIdSource, DistinctNonZeroIds) {
  TraceIdSource ids;
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const TraceId t = ids.trace_id();
    const SpanId s = ids.span_id();
    EXPECT_FALSE(is_zero(t));
    EXPECT_FALSE(is_zero(s));
    EXPECT_TRUE(seen.insert(to_hex(t)).second);
    EXPECT_TRUE(seen.insert(to_hex(s)).second);
  }
}

}  // namespace
}  // namespace pdgate
