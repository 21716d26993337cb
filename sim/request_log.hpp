// What each engine received and how it ended, for integration tests
// (GET /sim/requests). A bounded ring: the newest records win.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/kv_registry.hpp"

namespace pdgate::sim {

enum class Outcome { in_progress, completed, aborted, error };

const char* to_string(Outcome o);

struct RequestRecord {
  std::uint64_t seq = 0;
  std::string method;
  std::string path;                                          // the request target, query included
  std::vector<std::pair<std::string, std::string>> headers;  // lowercase names
  std::string body;
  std::optional<std::string> x_request_id;  // the header, when sent
  std::optional<std::string> tls_sni;       // the TLS server name the client sent
  std::string request_id;                   // the id used (header or generated)
  std::int64_t received_at_ms = 0;
  std::optional<std::int64_t> first_byte_at_ms;   // status line written
  std::optional<std::int64_t> first_token_at_ms;  // first body data written
  std::optional<std::int64_t> ended_at_ms;
  Outcome outcome = Outcome::in_progress;
  int status = 0;  // HTTP status answered, 0 before the answer
  KvResult kv_result = KvResult::none;
  bool kv_params_issued = false;
  std::string fault;  // the X-Sim-Fault header or the flag that fired
  std::size_t prompt_tokens = 0;
  std::size_t cached_tokens = 0;
  std::size_t completion_tokens = 0;
  // The engine core (data-parallel rank) that served a generation request.
  std::optional<std::size_t> data_parallel_rank;
  // A stream's first kMaxStreamRecord bytes of events as written (after
  // the headers, before chunk framing): what a relay must pass on byte
  // for byte.
  std::string stream_sent;
};

inline constexpr std::size_t kMaxStreamRecord = 16u << 10;

nlohmann::ordered_json to_json(const RequestRecord& r);

class RequestLog {
 public:
  // Bounded by record count and by the bytes of the bodies kept, so large
  // prompts cannot make the ring the biggest thing in memory.
  explicit RequestLog(std::size_t capacity = 2000, std::size_t max_body_bytes = 256u << 20)
      : capacity_(capacity), max_body_bytes_(max_body_bytes) {}

  // Records are shared: the handler keeps updating one after it is logged.
  std::shared_ptr<RequestRecord> add(RequestRecord r);
  void clear() {
    ring_.clear();
    body_bytes_ = 0;
  }
  std::size_t size() const { return ring_.size(); }
  nlohmann::ordered_json to_json() const;

 private:
  std::size_t capacity_;
  std::size_t max_body_bytes_;
  std::size_t body_bytes_ = 0;
  std::uint64_t next_seq_ = 1;
  std::deque<std::shared_ptr<RequestRecord>> ring_;
};

}  // namespace pdgate::sim
