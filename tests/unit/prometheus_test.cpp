// PrometheusText: the exposition format every /metrics is written in.
#include "core/prometheus.hpp"

#include <gtest/gtest.h>

#include "core/metrics.hpp"

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
  Histogram h;
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

}  // namespace
}  // namespace pdgate
