#include "core/access_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <nlohmann/json.hpp>

#include "core/instance.hpp"
#include "core/json_body.hpp"

namespace pdgate {

namespace {

// Lines wait at most this long before the writer picks them up; under
// load the writer is woken as soon as this many are queued.
constexpr auto kFlushInterval = std::chrono::milliseconds(200);
constexpr std::size_t kWakeAt = 256;

std::string iso_time(std::chrono::system_clock::time_point t) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];  // room for any int the compiler can imagine
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms % 1000));
  return buf;
}

double to_ms(std::chrono::microseconds d) {
  return static_cast<double>(d.count()) / 1000.0;
}

std::string url_of(const std::shared_ptr<const Instance>& i) {
  return i ? i->spec.url : "";
}

std::string encode_urls(const RequestRecord& r) {
  std::string out;
  for (const auto& i : r.encode) {
    if (!out.empty())
      out += ',';
    out += i->spec.url;
  }
  return out;
}

// The stages that chose an instance, with their policies: "prefill:x,decode:y".
std::string policies_used(const RequestRecord& r, const StagePolicies& p) {
  std::string out;
  auto add = [&out](bool used, std::string_view stage, const std::string& name) {
    if (!used)
      return;
    if (!out.empty())
      out += ',';
    out += stage;
    out += ':';
    out += name;
  };
  add(!r.encode.empty(), "encode", p.encode);
  add(r.prefill != nullptr, "prefill", p.prefill);
  add(r.decode != nullptr, "decode", p.decode);
  return out;
}

// A text field's value: as is when it is a plain token, "-" when empty,
// else JSON-quoted, so that a client-chosen value (a model name with a
// space or a newline) cannot forge a field or a line.
std::string text_value(std::string_view s) {
  if (s.empty())
    return "-";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f || c == '"' || c == '\\' || c == '=')
      return json_quote(s);
  }
  return std::string(s);
}

std::string format_text(const RequestRecord& r, const StagePolicies& p) {
  std::string line;
  line.reserve(256);
  char num[64];
  auto field = [&line](std::string_view key, std::string_view value) {
    line += ' ';
    line += key;
    line += '=';
    line += value;
  };
  line += iso_time(r.received_wall);
  field("request_id", text_value(r.request_id));
  field("trace_id", text_value(r.trace_id));
  field("method", text_value(r.method));
  field("route", text_value(r.route));
  field("status", std::to_string(r.status));
  field("stage", text_value(r.stage));
  field("client_left", r.client_left ? "true" : "false");
  field("stream", r.stream ? "true" : "false");
  field("model", text_value(r.model));
  field("encode", text_value(encode_urls(r)));
  field("prefill", text_value(url_of(r.prefill)));
  field("decode", text_value(url_of(r.decode)));
  if (r.ttft) {
    std::snprintf(num, sizeof num, "%.3f", to_ms(*r.ttft));
    field("ttft_ms", num);
  } else {
    field("ttft_ms", "-");
  }
  std::snprintf(num, sizeof num, "%.3f", to_ms(r.total));
  field("total_ms", num);
  field("bytes_sent", std::to_string(r.bytes_sent));
  field("prompt_tokens", r.usage ? std::to_string(r.usage->prompt_tokens) : "-");
  field("completion_tokens", r.usage ? std::to_string(r.usage->completion_tokens) : "-");
  field("retries", std::to_string(r.retries));
  field("conversation", text_value(r.conversation));
  field("policy", text_value(policies_used(r, p)));
  line += '\n';
  return line;
}

std::string format_json(const RequestRecord& r, const StagePolicies& p) {
  using nlohmann::json;
  auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  json encode = json::array();
  for (const auto& i : r.encode)
    encode.push_back(i->spec.url);
  json policy = json::object();
  if (!r.encode.empty())
    policy["encode"] = p.encode;
  if (r.prefill)
    policy["prefill"] = p.prefill;
  if (r.decode)
    policy["decode"] = p.decode;
  json j = {
      {"time", iso_time(r.received_wall)},
      {"request_id", or_null(r.request_id)},
      {"trace_id", or_null(r.trace_id)},
      {"method", r.method},
      {"route", r.route},
      {"status", r.status},
      {"stage", r.stage},
      {"client_left", r.client_left},
      {"stream", r.stream},
      {"model", or_null(r.model)},
      {"encode", std::move(encode)},
      {"prefill", or_null(url_of(r.prefill))},
      {"decode", or_null(url_of(r.decode))},
      {"ttft_ms", r.ttft ? json(to_ms(*r.ttft)) : json(nullptr)},
      {"total_ms", to_ms(r.total)},
      {"bytes_sent", r.bytes_sent},
      {"prompt_tokens", r.usage ? json(r.usage->prompt_tokens) : json(nullptr)},
      {"completion_tokens", r.usage ? json(r.usage->completion_tokens) : json(nullptr)},
      {"retries", r.retries},
      {"conversation", or_null(r.conversation)},
      {"policy", std::move(policy)},
  };
  // Invalid UTF-8 from a client (a model name) is replaced, never fatal.
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + '\n';
}

}  // namespace

std::string trace_id_of(std::string_view v) {
  // version "00" and its 55 bytes; later versions may append fields.
  if (v.size() < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-')
    return {};
  auto hex = [](std::string_view s) {
    for (char c : s) {
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
        return false;
    }
    return true;
  };
  const std::string_view version = v.substr(0, 2), trace = v.substr(3, 32);
  if (!hex(version) || version == "ff" || !hex(trace) || !hex(v.substr(36, 16)) ||
      !hex(v.substr(53, 2)) || (version == "00" && v.size() != 55) ||
      trace.find_first_not_of('0') == std::string_view::npos)
    return {};
  return std::string(trace);
}

std::string format_access_line(const RequestRecord& r, AccessLogFormat format,
                               const StagePolicies& policies) {
  return format == AccessLogFormat::json ? format_json(r, policies) : format_text(r, policies);
}

Result<std::unique_ptr<AccessLog>> AccessLog::open(const std::string& target,
                                                   AccessLogFormat format, StagePolicies policies,
                                                   std::size_t capacity) {
  std::FILE* out = stderr;
  bool owned = false;
  if (target != "stderr") {
    const int fd = ::open(target.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0)
      return fail("--access-log: cannot open " + target + ": " + std::strerror(errno));
    out = ::fdopen(fd, "a");
    if (out == nullptr) {
      ::close(fd);
      return fail("--access-log: cannot open " + target + ": " + std::strerror(errno));
    }
    owned = true;
  }
  return std::unique_ptr<AccessLog>(
      new AccessLog(out, owned, format, std::move(policies), capacity));
}

AccessLog::AccessLog(std::FILE* out, bool owned, AccessLogFormat format, StagePolicies policies,
                     std::size_t capacity)
    : out_(out),
      owned_(owned),
      format_(format),
      policies_(std::move(policies)),
      capacity_(capacity) {
  queue_.reserve(std::min(capacity_, kWakeAt));
  writer_ = std::thread([this] { run(); });
}

AccessLog::~AccessLog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  writer_.join();
  if (owned_)
    std::fclose(out_);
  else
    std::fflush(out_);
}

void AccessLog::submit(RequestRecord&& r) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= capacity_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queue_.push_back(std::move(r));
    wake = queue_.size() == kWakeAt;
  }
  // Otherwise the writer's timer picks the record up: no system call per
  // request to wake it.
  if (wake)
    wake_.notify_one();
}

void AccessLog::run() {
  std::vector<RequestRecord> batch;
  std::string text;
  for (;;) {
    bool stopping = false;
    {
      std::unique_lock lock(mu_);
      wake_.wait_for(lock, kFlushInterval, [this] { return stop_ || queue_.size() >= kWakeAt; });
      batch.swap(queue_);
      stopping = stop_;
    }
    if (!batch.empty()) {
      text.clear();
      for (const auto& r : batch)
        text += format_access_line(r, format_, policies_);
      // A short write (disk full) loses these lines; the next batch tries
      // again.
      std::fwrite(text.data(), 1, text.size(), out_);
      std::fflush(out_);
      written_.fetch_add(batch.size(), std::memory_order_relaxed);
      batch.clear();
    }
    if (stopping) {
      std::lock_guard lock(mu_);
      if (queue_.empty())
        return;
    }
  }
}

}  // namespace pdgate
