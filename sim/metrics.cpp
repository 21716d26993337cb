#include "sim/metrics.hpp"

#include <cstdio>

namespace pdgate::sim {

namespace {

constexpr KvResult kKvResults[] = {KvResult::valid, KvResult::reused, KvResult::unknown,
                                   KvResult::pull_failed};

std::string escape_label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  std::string s = buf;
  // prometheus_client prints floats ("3.0"); keep that look for integers.
  if (s.find_first_of(".eE") == std::string::npos && s != "inf" && s != "nan")
    s += ".0";
  return s;
}

class Writer {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void sample(std::string_view name, std::string_view labels, double v) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      out_ += labels;
      out_ += '}';
    }
    out_ += ' ';
    out_ += num(v);
    out_ += '\n';
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

std::string render_prometheus(const Counters& c, const Gauges& g, std::string_view model) {
  const std::string model_label = "model_name=\"" + escape_label(model) + "\"";
  const std::string vl = "engine=\"0\"," + model_label;
  // The load gauges per engine core (data-parallel rank), the counters
  // for the engine as a whole.
  std::vector<CoreGauges> cores = g.cores;
  if (cores.empty())
    cores.push_back({g.running, g.waiting, g.kv_cache_usage});
  Writer w;
  const auto per_core = [&](const char* name, auto value) {
    for (std::size_t i = 0; i < cores.size(); ++i) {
      w.sample(name, "engine=\"" + std::to_string(i) + "\"," + model_label,
               static_cast<double>(value(cores[i])));
    }
  };
  w.family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.");
  per_core("vllm:num_requests_running", [](const CoreGauges& k) { return k.running; });
  w.family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
  per_core("vllm:num_requests_waiting", [](const CoreGauges& k) { return k.waiting; });
  w.family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
  per_core("vllm:kv_cache_usage_perc", [](const CoreGauges& k) { return k.kv_cache_usage; });
  w.family("vllm:prefix_cache_queries_total", "counter",
           "Prefix cache queries, in terms of number of queried tokens.");
  w.sample("vllm:prefix_cache_queries_total", vl, static_cast<double>(c.prefix_cache_queries));
  w.family("vllm:prefix_cache_hits_total", "counter",
           "Prefix cache hits, in terms of number of cached tokens.");
  w.sample("vllm:prefix_cache_hits_total", vl, static_cast<double>(c.prefix_cache_hits));
  w.family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.");
  w.sample("vllm:prompt_tokens_total", vl, static_cast<double>(c.prompt_tokens));
  w.family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.");
  w.sample("vllm:generation_tokens_total", vl, static_cast<double>(c.generation_tokens));
  w.family("vllm:request_success_total", "counter", "Count of successfully processed requests.");
  w.sample("vllm:request_success_total", vl, static_cast<double>(c.requests_completed));

  w.family("sim:requests_total", "counter", "Requests received, by path.");
  for (const auto& [path, n] : c.requests_by_path) {
    w.sample("sim:requests_total", "path=\"" + escape_label(path) + "\"", static_cast<double>(n));
  }
  w.family("sim:aborted_total", "counter", "Requests stopped because the client went away.");
  w.sample("sim:aborted_total", "", static_cast<double>(c.aborted));
  w.family("sim:kv_params_total", "counter", "KV pulls made by this engine, by result.");
  for (KvResult r : kKvResults) {
    w.sample("sim:kv_params_total", std::string("result=\"") + to_string(r) + "\"",
             static_cast<double>(c.kv(r)));
  }
  w.family("sim:kv_issued_total", "counter", "kv_transfer_params issued by this engine.");
  w.sample("sim:kv_issued_total", "", static_cast<double>(c.kv_issued));
  w.family("sim:kv_pulls_served_total", "counter", "KV pulls answered by this engine, by result.");
  for (KvResult r : {KvResult::valid, KvResult::reused, KvResult::unknown}) {
    w.sample("sim:kv_pulls_served_total", std::string("result=\"") + to_string(r) + "\"",
             static_cast<double>(c.kv_pulls_served[static_cast<std::size_t>(r)]));
  }
  w.family("sim:profile_total", "counter", "Profiler start/stop calls.");
  w.sample("sim:profile_total", "action=\"start\"", static_cast<double>(c.profile_start));
  w.sample("sim:profile_total", "action=\"stop\"", static_cast<double>(c.profile_stop));
  w.family("sim:encoder_violations_total", "counter",
           "Encoder requests rejected for breaking the encoder request shape.");
  w.sample("sim:encoder_violations_total", "", static_cast<double>(c.encoder_violations));
  w.family("sim:rejected_total", "counter", "Requests answered 503 because the queue was full.");
  w.sample("sim:rejected_total", "", static_cast<double>(c.requests_rejected));
  w.family("sim:faults_total", "counter", "Injected faults (error, hang, die-after).");
  w.sample("sim:faults_total", "", static_cast<double>(c.faults_injected));
  w.family("sim:open_connections", "gauge", "Open client connections.");
  w.sample("sim:open_connections", "", static_cast<double>(g.open_connections));
  w.family("sim:connections_total", "counter", "Client connections accepted.");
  w.sample("sim:connections_total", "", static_cast<double>(g.connections_total));
  w.family("sim:issued_kv_outstanding", "gauge", "Issued kv params not pulled and not expired.");
  w.sample("sim:issued_kv_outstanding", "", static_cast<double>(g.issued_kv_outstanding));
  w.family("sim:prefix_cache_blocks", "gauge", "Blocks held by the prefix cache.");
  w.sample("sim:prefix_cache_blocks", "", static_cast<double>(g.prefix_cache_blocks));
  return w.take();
}

nlohmann::ordered_json stats_json(const Counters& c, const Gauges& g) {
  nlohmann::ordered_json j;
  j["running"] = g.running;
  j["waiting"] = g.waiting;
  j["open_connections"] = g.open_connections;
  j["connections_total"] = g.connections_total;
  j["issued_kv_outstanding"] = g.issued_kv_outstanding;
  j["kv_cache_usage_perc"] = g.kv_cache_usage;
  j["prefix_cache_blocks"] = g.prefix_cache_blocks;
  nlohmann::ordered_json paths = nlohmann::ordered_json::object();
  for (const auto& [p, n] : c.requests_by_path)
    paths[p] = n;
  j["requests_total"] = std::move(paths);
  j["aborted_total"] = c.aborted;
  nlohmann::ordered_json kv = nlohmann::ordered_json::object();
  for (KvResult r : kKvResults)
    kv[to_string(r)] = c.kv(r);
  j["kv_params_total"] = std::move(kv);
  j["kv_issued_total"] = c.kv_issued;
  nlohmann::ordered_json served = nlohmann::ordered_json::object();
  for (KvResult r : {KvResult::valid, KvResult::reused, KvResult::unknown}) {
    served[to_string(r)] = c.kv_pulls_served[static_cast<std::size_t>(r)];
  }
  j["kv_pulls_served_total"] = std::move(served);
  j["profile_total"] = {{"start", c.profile_start}, {"stop", c.profile_stop}};
  j["encoder_violations_total"] = c.encoder_violations;
  j["prefix_cache_queries_total"] = c.prefix_cache_queries;
  j["prefix_cache_hits_total"] = c.prefix_cache_hits;
  j["prompt_tokens_total"] = c.prompt_tokens;
  j["generation_tokens_total"] = c.generation_tokens;
  j["request_success_total"] = c.requests_completed;
  j["rejected_total"] = c.requests_rejected;
  j["faults_total"] = c.faults_injected;
  return j;
}

}  // namespace pdgate::sim
