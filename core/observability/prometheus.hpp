// The Prometheus text exposition format (version 0.0.4), written in one
// place for every metric pdgate exports: the gateway's, the policies', the
// admin listener's. A family is announced once (HELP, TYPE), then its
// samples; label values are escaped here, so no caller can produce an
// unparsable line.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace pdgate {

class Histogram;

class PrometheusText {
 public:
  using Labels = std::initializer_list<std::pair<std::string_view, std::string_view>>;

  void counter(std::string_view name, std::string_view help) { family(name, "counter", help); }
  void gauge(std::string_view name, std::string_view help) { family(name, "gauge", help); }

  void sample(std::string_view name, Labels labels, std::uint64_t value);
  void sample(std::string_view name, Labels labels, std::int64_t value);
  void sample(std::string_view name, Labels labels, double value);
  void sample(std::string_view name, std::uint64_t value) { sample(name, {}, value); }
  void sample(std::string_view name, std::int64_t value) { sample(name, {}, value); }

  // A whole histogram family: _bucket per bound and +Inf, _sum, _count.
  void histogram(std::string_view name, std::string_view help, const Histogram& h);
  // A labelled histogram: the family once, then one series per label set.
  void histogram_family(std::string_view name, std::string_view help) {
    family(name, "histogram", help);
  }
  void histogram_series(std::string_view name, Labels labels, const Histogram& h);

  const std::string& text() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void family(std::string_view name, std::string_view type, std::string_view help);
  void begin_sample(std::string_view name, Labels labels, std::string_view le = {});

  std::string out_;
};

// A label value with backslash, double quote and newline escaped.
std::string prometheus_escape(std::string_view v);

}  // namespace pdgate
