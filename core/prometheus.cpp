#include "core/prometheus.hpp"

#include <cstdio>

#include "core/metrics.hpp"

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

void PrometheusText::begin_sample(std::string_view name, Labels labels) {
  out_ += name;
  if (labels.size() != 0) {
    out_ += '{';
    bool first = true;
    for (const auto& [k, v] : labels) {
      if (!first)
        out_ += ',';
      first = false;
      out_ += k;
      out_ += "=\"";
      out_ += prometheus_escape(v);
      out_ += '"';
    }
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
  std::snprintf(buf, sizeof buf, "%.9g", value);
  out_ += buf;
  out_ += '\n';
}

void PrometheusText::histogram(std::string_view name, std::string_view help, const Histogram& h) {
  family(name, "histogram", help);
  const auto snap = h.snapshot();
  const std::string bucket = std::string(name) + "_bucket";
  char le[32];
  for (std::size_t i = 0; i < Histogram::kBounds.size(); ++i) {
    std::snprintf(le, sizeof le, "%g", Histogram::kBounds[i]);
    sample(bucket, {{"le", le}}, snap.cumulative[i]);
  }
  sample(bucket, {{"le", "+Inf"}}, snap.count);
  sample(std::string(name) + "_sum", {}, snap.sum_seconds);
  // _count equals the +Inf bucket as read, so a scrape is coherent.
  sample(std::string(name) + "_count", {}, snap.count);
}

}  // namespace pdgate
