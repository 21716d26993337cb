// vLLM's Prometheus text, read for the few load gauges policies use. The
// text comes from an engine (hostile input, fuzzed by fuzz_engine_metrics):
// malformed lines are skipped, never fatal.
#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>

#include "policies/metrics.hpp"

namespace pdgate::policy {
namespace {

struct Sum {
  double total = 0;
  int count = 0;
};

// Parses a Prometheus sample value ("3", "3.0", "1e-3", "NaN", "+Inf").
std::optional<double> parse_value(std::string_view v) {
  double d = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (ec != std::errc() || ptr != v.data() + v.size() || !std::isfinite(d))
    return std::nullopt;
  return d;
}

// Whether a sample's label set `labels` ("{...}") has engine="<rank>".
bool names_engine(std::string_view labels, std::string_view rank) {
  std::size_t at = 0;
  while ((at = labels.find("engine=\"", at)) != std::string_view::npos) {
    // The label name must start there, not end a longer name.
    const bool starts =
        at > 0 && (labels[at - 1] == '{' || labels[at - 1] == ',' || labels[at - 1] == ' ');
    const std::string_view value = labels.substr(at + 8);
    if (starts && value.starts_with(rank) && value.size() > rank.size() &&
        value[rank.size()] == '"')
      return true;
    at += 8;
  }
  return false;
}

}  // namespace

EngineMetrics parse_vllm_metrics(std::string_view text, std::optional<std::uint32_t> engine) {
  char rank_digits[12] = {};
  std::string_view rank;
  if (engine) {
    rank = std::string_view(
        rank_digits, static_cast<std::size_t>(
                         std::to_chars(rank_digits, rank_digits + 11, *engine).ptr - rank_digits));
  }
  Sum running, waiting, kv, kv_old;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos)
      eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r')
      line.remove_suffix(1);
    if (line.empty() || line.front() == '#')
      continue;
    // name{labels} value [timestamp]; label values may hold spaces or
    // braces inside quotes, so the name ends at '{' or ' ' and the labels
    // at the last '}'.
    const std::size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos)
      continue;
    const std::string_view name = line.substr(0, name_end);
    Sum* target = nullptr;
    if (name == "vllm:num_requests_running")
      target = &running;
    else if (name == "vllm:num_requests_waiting")
      target = &waiting;
    else if (name == "vllm:kv_cache_usage_perc")
      target = &kv;
    else if (name == "vllm:gpu_cache_usage_perc")
      target = &kv_old;
    if (target == nullptr)
      continue;
    std::string_view rest = line.substr(name_end);
    if (rest.front() == '{') {
      const std::size_t close = rest.rfind('}');
      if (close == std::string_view::npos)
        continue;
      if (engine && !names_engine(rest.substr(0, close + 1), rank))
        continue;
      rest = rest.substr(close + 1);
    } else if (engine) {
      continue;  // no engine label: not this rank's series
    }
    while (!rest.empty() && rest.front() == ' ')
      rest.remove_prefix(1);
    const std::size_t sp = rest.find(' ');
    if (sp != std::string_view::npos)
      rest = rest.substr(0, sp);  // drop the timestamp
    auto v = parse_value(rest);
    if (!v)
      continue;
    target->total += *v;
    ++target->count;
  }
  EngineMetrics m;
  if (running.count > 0)
    m.running = running.total;
  if (waiting.count > 0)
    m.waiting = waiting.total;
  const Sum& k = kv.count > 0 ? kv : kv_old;
  if (k.count > 0)
    m.kv_usage = k.total / k.count;
  return m;
}

}  // namespace pdgate::policy
