#include "core/observability/prometheus.hpp"

#include <cstdio>

#include "core/observability/metrics.hpp"

namespace pdgate {

std::string prometheus_escape(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void PrometheusText::family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  // HELP text escapes backslash and newline.
  for (char c : help) {
    if (c == '\\')
      out_ += "\\\\";
    else if (c == '\n')
      out_ += "\\n";
    else
      out_ += c;
  }
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void PrometheusText::begin_sample(std::string_view name, Labels labels, std::string_view le) {
  out_ += name;
  if (labels.size() != 0 || !le.empty()) {
    out_ += '{';
    bool first = true;
    auto label = [&](std::string_view k, std::string_view v) {
      if (!first)
        out_ += ',';
      first = false;
      out_ += k;
      out_ += "=\"";
      out_ += prometheus_escape(v);
      out_ += '"';
    };
    for (const auto& [k, v] : labels)
      label(k, v);
    if (!le.empty())
      label("le", le);
    out_ += '}';
  }
  out_ += ' ';
}

void PrometheusText::sample(std::string_view name, Labels labels, std::uint64_t value) {
  begin_sample(name, labels);
  out_ += std::to_string(value);
  out_ += '\n';
}

void PrometheusText::sample(std::string_view name, Labels labels, std::int64_t value) {
  begin_sample(name, labels);
  out_ += std::to_string(value);
  out_ += '\n';
}

void PrometheusText::sample(std::string_view name, Labels labels, double value) {
  begin_sample(name, labels);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.15g", value);
  out_ += buf;
  out_ += '\n';
}

void PrometheusText::histogram(std::string_view name, std::string_view help, const Histogram& h) {
  histogram_family(name, help);
  histogram_series(name, {}, h);
}

void PrometheusText::histogram_series(std::string_view name, Labels labels, const Histogram& h) {
  const auto snap = h.snapshot();
  const std::string bucket = std::string(name) + "_bucket";
  char le[32];
  const auto bounds = h.bounds();
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    std::snprintf(le, sizeof le, "%g", bounds[i]);
    begin_sample(bucket, labels, le);
    out_ += std::to_string(snap.cumulative[i]);
    out_ += '\n';
  }
  begin_sample(bucket, labels, "+Inf");
  out_ += std::to_string(snap.count);
  out_ += '\n';
  sample(std::string(name) + "_sum", labels, snap.sum_seconds);
  // _count equals the +Inf bucket as read, so a scrape is coherent.
  sample(std::string(name) + "_count", labels, snap.count);
}

}  // namespace pdgate
