// PrometheusText: the exposition format every /metrics is written in.
#include "core/observability/prometheus.hpp"

#include <gtest/gtest.h>

#include "core/observability/metrics.hpp"

namespace pdgate {
namespace {

// A family is announced once with HELP and TYPE; samples follow with
// their labels in order, values as integers or shortest floats.
TEST(PrometheusText, FamiliesAndSamples) {
  PrometheusText m;
  m.counter("x_total", "Things.");
  m.sample("x_total", {{"a", "1"}, {"b", "two"}}, std::uint64_t{3});
  m.gauge("y", "A level.");
  m.sample("y", std::int64_t{-2});
  m.sample("z", {}, 0.25);
  EXPECT_EQ(m.text(),
            "# HELP x_total Things.\n# TYPE x_total counter\n"
            "x_total{a=\"1\",b=\"two\"} 3\n"
            "# HELP y A level.\n# TYPE y gauge\ny -2\nz 0.25\n");
}

// Label values with quotes, backslashes and newlines stay one parsable line.
TEST(PrometheusText, EscapesLabelValuesAndHelp) {
  PrometheusText m;
  m.counter("e_total", "back\\slash\nnewline");
  m.sample("e_total", {{"url", "a\"b\\c\nd"}}, std::uint64_t{1});
  EXPECT_EQ(m.text(),
            "# HELP e_total back\\\\slash\\nnewline\n# TYPE e_total counter\n"
            "e_total{url=\"a\\\"b\\\\c\\nd\"} 1\n");
}

// A histogram renders cumulative buckets, +Inf equal to _count, and _sum.
TEST(PrometheusText, HistogramIsCumulativeAndCoherent) {
  Histogram h(kLlmLatencyBounds);
  h.observe(0.0005);
  h.observe(0.2);
  h.observe(100);
  PrometheusText m;
  m.histogram("lat_seconds", "Latency.", h);
  const auto& t = m.text();
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"0.001\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"0.25\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_count 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_sum 100.2005\n"), std::string::npos) << t;
}

// Each histogram has its own buckets: LLM latencies reach the 600 s
// first-byte timeout, gateway overhead is resolved in microseconds (a
// 15 us and a 70 us observation land in different buckets, not both in
// the first millisecond), and the sum keeps sub-microsecond precision.
TEST(PrometheusText, PerHistogramBuckets) {
  Histogram llm(kLlmLatencyBounds);
  llm.observe(450);
  Histogram overhead(kOverheadBounds);
  overhead.observe(0.000015);
  overhead.observe(0.00007);
  overhead.observe(0.0000005);
  PrometheusText m;
  m.histogram("llm_seconds", "LLM.", llm);
  m.histogram("overhead_seconds", "Overhead.", overhead);
  const auto& t = m.text();
  EXPECT_NE(t.find("llm_seconds_bucket{le=\"300\"} 0\n"), std::string::npos) << t;
  EXPECT_NE(t.find("llm_seconds_bucket{le=\"600\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("overhead_seconds_bucket{le=\"1e-05\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("overhead_seconds_bucket{le=\"2.5e-05\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("overhead_seconds_bucket{le=\"5e-05\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("overhead_seconds_bucket{le=\"0.0001\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("overhead_seconds_sum 8.55e-05\n"), std::string::npos) << t;
}

// A labelled histogram: one family, then per label set its buckets (le
// last), _sum and _count; observe_n adds n observations at once.
TEST(PrometheusText, LabelledHistogramSeries) {
  Histogram a(kTokenGapBounds), b(kTokenGapBounds);
  a.observe(0.02);
  b.observe_n(0, 3);
  PrometheusText m;
  m.histogram_family("itl_seconds", "Gaps.");
  m.histogram_series("itl_seconds", {{"url", "http://a"}}, a);
  m.histogram_series("itl_seconds", {{"url", "http://b"}}, b);
  const auto& t = m.text();
  EXPECT_EQ(t.find("# TYPE itl_seconds histogram"), t.rfind("# TYPE itl_seconds histogram"));
  EXPECT_NE(t.find("itl_seconds_bucket{url=\"http://a\",le=\"0.015\"} 0\n"), std::string::npos)
      << t;
  EXPECT_NE(t.find("itl_seconds_bucket{url=\"http://a\",le=\"0.02\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("itl_seconds_bucket{url=\"http://b\",le=\"0.001\"} 3\n"), std::string::npos)
      << t;
  EXPECT_NE(t.find("itl_seconds_count{url=\"http://b\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("itl_seconds_sum{url=\"http://a\"} 0.02\n"), std::string::npos) << t;
}

}  // namespace
}  // namespace pdgate
