#include "sim/request_log.hpp"

namespace pdgate::sim {

const char* to_string(Outcome o) {
  switch (o) {
    case Outcome::in_progress:
      return "in_progress";
    case Outcome::completed:
      return "completed";
    case Outcome::aborted:
      return "aborted";
    case Outcome::error:
      return "error";
  }
  return "?";
}

namespace {

template <typename T>
nlohmann::ordered_json opt(const std::optional<T>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

}  // namespace

nlohmann::ordered_json to_json(const RequestRecord& r) {
  nlohmann::ordered_json j;
  j["seq"] = r.seq;
  j["method"] = r.method;
  j["path"] = r.path;
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  for (const auto& [k, v] : r.headers) {
    // Repeated headers are joined the way HTTP allows folding them.
    if (h.contains(k)) {
      h[k] = h[k].get<std::string>() + ", " + v;
    } else {
      h[k] = v;
    }
  }
  j["headers"] = std::move(h);
  // Bodies are raw bytes: whoever dumps this must use error_handler_t::replace
  // so invalid UTF-8 cannot make dump() throw.
  j["body"] = r.body;
  j["x_request_id"] = opt(r.x_request_id);
  j["tls_sni"] = opt(r.tls_sni);
  j["request_id"] = r.request_id;
  j["received_at_ms"] = r.received_at_ms;
  j["first_byte_at_ms"] = opt(r.first_byte_at_ms);
  j["first_token_at_ms"] = opt(r.first_token_at_ms);
  j["ended_at_ms"] = opt(r.ended_at_ms);
  j["outcome"] = to_string(r.outcome);
  j["status"] = r.status;
  j["kv_result"] = to_string(r.kv_result);
  j["kv_params_issued"] = r.kv_params_issued;
  j["fault"] = r.fault.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.fault);
  j["prompt_tokens"] = r.prompt_tokens;
  j["data_parallel_rank"] = opt(r.data_parallel_rank);
  j["cached_tokens"] = r.cached_tokens;
  j["completion_tokens"] = r.completion_tokens;
  j["stream_sent"] = r.stream_sent;
  return j;
}

std::shared_ptr<RequestRecord> RequestLog::add(RequestRecord r) {
  r.seq = next_seq_++;
  auto p = std::make_shared<RequestRecord>(std::move(r));
  body_bytes_ += p->body.size();
  ring_.push_back(p);
  while (ring_.size() > capacity_ || (ring_.size() > 1 && body_bytes_ > max_body_bytes_)) {
    body_bytes_ -= ring_.front()->body.size();
    ring_.pop_front();
  }
  return p;
}

nlohmann::ordered_json RequestLog::to_json() const {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const auto& r : ring_)
    a.push_back(sim::to_json(*r));
  return a;
}

}  // namespace pdgate::sim
