#include "core/gateway/access_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <utility>

#include <spdlog/spdlog.h>

#include "core/base/json_body.hpp"
#include "core/upstream/instance.hpp"

namespace pdgate {

namespace {

// Lines wait at most this long before the writer picks them up; under
// load the writer is woken as soon as this many are queued.
constexpr auto kFlushInterval = std::chrono::milliseconds(200);
constexpr std::size_t kWakeAt = 256;

// "2026-11-24T20:41:03.123Z", by calendar arithmetic (gmtime_r takes
// the time zone lock and costs more than the rest of the line).
std::string iso_time(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const auto ms = floor<milliseconds>(t);
  const auto day = floor<days>(ms);
  const year_month_day ymd{day};
  const hh_mm_ss hms{ms - day};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02d.%03dZ",
                static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()), static_cast<int>(hms.hours().count()),
                static_cast<int>(hms.minutes().count()), static_cast<int>(hms.seconds().count()),
                static_cast<int>(hms.subseconds().count()));
  return buf;
}

std::string_view url_of(const std::shared_ptr<const Instance>& i) {
  return i ? std::string_view(i->spec.url) : std::string_view();
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

// The stages that chose an instance, with their policies' names (or
// versions): as text "prefill:x,decode:y", as JSON {"prefill":"x","decode":"y"}.
std::string policies_used(const RequestRecord& r, bool json, bool versions = false) {
  const StagePolicies& p = r.policies;
  std::string out;
  auto add = [&](bool used, std::string_view stage, const std::string& name) {
    if (!used || name.empty())
      return;
    if (!out.empty())
      out += ',';
    out += json ? json_quote(stage) : std::string(stage);
    out += ':';
    out += json ? json_quote(name) : name;
  };
  add(!r.encode.empty(), "encode", versions ? p.encode_version : p.encode);
  add(r.prefill != nullptr, "prefill", versions ? p.prefill_version : p.prefill);
  add(r.decode != nullptr, "decode", versions ? p.decode_version : p.decode);
  return json ? "{" + out + "}" : out;
}

// Whether `s` goes out as it is: printable ASCII without quotes,
// backslashes or '=' (text), or without quotes and backslashes (JSON).
bool plain(std::string_view s, bool json) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f || c == '"' || c == '\\' || (!json && (c == ' ' || c == '=')))
      return false;
  }
  return true;
}

// A text field's value: as is when it is a plain token, "-" when empty,
// else JSON-quoted, so that a client-chosen value (a model name with a
// space or a newline) cannot forge a field or a line.
void append_text_value(std::string& line, std::string_view s) {
  if (s.empty())
    line += '-';
  else if (plain(s, false))
    line += s;
  else
    line += json_quote(s);
}

// A JSON string; quoted by json_quote only when it needs escaping
// (invalid UTF-8 from a client becomes U+FFFD there).
void append_json_string(std::string& line, std::string_view s) {
  if (plain(s, true)) {
    line += '"';
    line += s;
    line += '"';
  } else {
    line += json_quote(s);
  }
}

// A field's value, typed: the text format writes each as a token, the
// JSON one as its JSON type.
struct Value {
  enum Kind { null, text, number, boolean, raw } kind = null;
  std::string_view ref;  // text the record holds
  std::string own;       // text, digits or raw JSON made for the line
  bool b = false;
  std::string_view view() const { return own.empty() ? ref : std::string_view(own); }
};

Value text_of(std::string_view s) {
  return s.empty() ? Value{} : Value{Value::text, s, {}};
}
Value text_of(std::string s) {
  return s.empty() ? Value{} : Value{Value::text, {}, std::move(s)};
}
Value number_of(std::uint64_t n) {
  return Value{Value::number, {}, std::to_string(n)};
}
// Milliseconds with 3 decimals, by integer arithmetic: snprintf's
// floating-point path costs more than the rest of a line.
Value ms_of(std::chrono::microseconds d) {
  const auto us = std::max<std::int64_t>(0, d.count());
  std::string out = std::to_string(us / 1000);
  const auto frac = static_cast<int>(us % 1000);
  out += '.';
  out += static_cast<char>('0' + frac / 100);
  out += static_cast<char>('0' + frac / 10 % 10);
  out += static_cast<char>('0' + frac % 10);
  return Value{Value::number, {}, std::move(out)};
}
Value bool_of(bool b) {
  return Value{Value::boolean, {}, {}, b};
}

// Every field of a line, in order, to `emit(key, value)`: the one list
// both formats write.
template <class Emit>
void fields(const RequestRecord& r, bool json, Emit&& emit) {
  emit("request_id", text_of(std::string_view(r.request_id)));
  emit("trace_id", text_of(std::string_view(r.trace_id)));
  emit("method", text_of(std::string_view(r.method)));
  emit("route", text_of(std::string_view(r.route)));
  emit("status", number_of(r.status));
  emit("stage", text_of(std::string_view(r.stage)));
  emit("client_left", bool_of(r.client_left));
  emit("stream", bool_of(r.stream));
  emit("model", text_of(std::string_view(r.model)));
  if (json) {
    std::string list = "[";
    for (const auto& i : r.encode) {
      if (list.size() > 1)
        list += ',';
      list += json_quote(i->spec.url);
    }
    emit("encode", Value{Value::raw, {}, list + "]"});
  } else {
    emit("encode", text_of(encode_urls(r)));
  }
  emit("prefill", text_of(url_of(r.prefill)));
  emit("decode", text_of(url_of(r.decode)));
  emit("ttft_ms", r.ttft ? ms_of(*r.ttft) : Value{});
  emit("total_ms", ms_of(r.total));
  emit("bytes_sent", number_of(r.bytes_sent));
  emit("prompt_tokens", r.usage ? number_of(r.usage->prompt_tokens) : Value{});
  emit("completion_tokens", r.usage ? number_of(r.usage->completion_tokens) : Value{});
  emit("retries", number_of(r.retries));
  emit("migrations", number_of(r.migrations));
  emit("migrated_from", text_of(std::string_view(r.migrated_from)));
  emit("conversation", text_of(std::string_view(r.conversation)));
  if (json) {
    emit("policy", Value{Value::raw, {}, policies_used(r, true)});
    emit("policy_version", Value{Value::raw, {}, policies_used(r, true, true)});
  } else {
    emit("policy", text_of(policies_used(r, false)));
    emit("policy_version", text_of(policies_used(r, false, true)));
  }
  emit("reject", text_of(std::string_view(r.reject)));
  emit("tenant", text_of(std::string_view(r.tenant)));
  emit("path", text_of(std::string_view(r.path)));
}

// A value as the format writes it: "-" or null when absent, text as a
// token or a JSON string.
void append_value(std::string& line, const Value& v, bool json) {
  switch (v.kind) {
    case Value::null:
      line += json ? "null" : "-";
      break;
    case Value::text:
      if (json)
        append_json_string(line, v.view());
      else
        append_text_value(line, v.view());
      break;
    case Value::boolean:
      line += v.b ? "true" : "false";
      break;
    case Value::number:
    case Value::raw:
      line += v.view();
      break;
  }
}

std::string format_text(const RequestRecord& r) {
  std::string line = iso_time(r.received_wall);
  line.reserve(384);
  fields(r, false, [&line](std::string_view key, const Value& v) {
    line += ' ';
    line += key;
    line += '=';
    append_value(line, v, false);
  });
  line += '\n';
  return line;
}

// Written directly: building an nlohmann object per line cost 5x the
// text format's instructions (bench/README.md).
std::string format_json(const RequestRecord& r) {
  std::string line = "{\"time\":\"" + iso_time(r.received_wall) + '"';
  line.reserve(512);
  fields(r, true, [&line](std::string_view key, const Value& v) {
    line += ",\"";
    line += key;
    line += "\":";
    append_value(line, v, true);
  });
  line += "}\n";
  return line;
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

std::string format_access_line(const RequestRecord& r, AccessLogFormat format) {
  return format == AccessLogFormat::json ? format_json(r) : format_text(r);
}

namespace {

// `path` opened for appending (created 0640), or why not.
Result<std::FILE*> open_for_append(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0)
    return fail("--access-log: cannot open " + path + ": " + std::strerror(errno));
  std::FILE* out = ::fdopen(fd, "a");
  if (out == nullptr) {
    const int err = errno;
    ::close(fd);
    return fail("--access-log: cannot open " + path + ": " + std::strerror(err));
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<AccessLog>> AccessLog::open(const std::string& target,
                                                   AccessLogFormat format, std::size_t capacity) {
  std::FILE* out = stderr;
  if (target != "stderr") {
    auto opened = open_for_append(target);
    if (!opened)
      return fail(opened.error());
    out = *opened;
  }
  return std::unique_ptr<AccessLog>(new AccessLog(out, target, format, capacity));
}

void AccessLog::reopen() {
  if (target_ == "stderr")
    return;
  {
    std::lock_guard lock(mu_);
    reopen_ = true;
  }
  wake_.notify_one();
}

void AccessLog::reopen_now() {
  auto opened = open_for_append(target_);
  if (!opened) {
    spdlog::error("SIGUSR1: {}; still writing to the file open before", opened.error());
    return;
  }
  std::fclose(out_);
  out_ = *opened;
  spdlog::info("SIGUSR1: access log reopened at {}", target_);
}

std::optional<std::string> AccessLog::problem(const std::string& target) {
  if (target == "stderr")
    return std::nullopt;
  auto cannot = [&target](int err) {
    return "--access-log: cannot open " + target + ": " + std::strerror(err);
  };
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      return cannot(EISDIR);
    if (::access(target.c_str(), W_OK) != 0)
      return cannot(errno);
    return std::nullopt;
  }
  if (errno != ENOENT)
    return cannot(errno);
  // Missing: open() creates it, which takes a folder it may write in.
  const auto slash = target.rfind('/');
  const std::string folder =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : target.substr(0, slash));
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    return cannot(errno);
  return std::nullopt;
}

AccessLog::AccessLog(std::FILE* out, std::string target, AccessLogFormat format,
                     std::size_t capacity)
    : out_(out),
      target_(std::move(target)),
      owned_(target_ != "stderr"),
      format_(format),
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
    bool reopen = false;
    {
      std::unique_lock lock(mu_);
      wake_.wait_for(lock, kFlushInterval,
                     [this] { return stop_ || reopen_ || queue_.size() >= kWakeAt; });
      batch.swap(queue_);
      stopping = stop_;
      reopen = std::exchange(reopen_, false);
    }
    if (!batch.empty()) {
      text.clear();
      for (const auto& r : batch)
        text += format_access_line(r, format_);
      // A short write (disk full) loses these lines; the next batch tries
      // again.
      std::fwrite(text.data(), 1, text.size(), out_);
      std::fflush(out_);
      written_.fetch_add(batch.size(), std::memory_order_relaxed);
      batch.clear();
    }
    if (reopen)
      reopen_now();
    if (stopping) {
      std::lock_guard lock(mu_);
      if (queue_.empty())
        return;
    }
  }
}

}  // namespace pdgate
