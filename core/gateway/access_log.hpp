// The access log: one line per client request, text or JSON, to a file or
// stderr. Workers hand their request's record to a bounded queue and go
// on; one writer thread formats and writes the lines. When the queue is
// full (the disk or the pipe cannot keep up) records are dropped and
// counted, never waited for: a worker's event loop never blocks on it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/base/result.hpp"
#include "core/pipeline/request_outcome.hpp"

namespace pdgate {

enum class AccessLogFormat { text, json };

// One line (with its '\n') for a record. Pure: unit-tested, and the writer
// thread's only formatting code.
std::string format_access_line(const RequestRecord& r, AccessLogFormat format);

// The trace id of a W3C `traceparent` header value
// ("00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>"), or empty when
// the value is not one (an all-zero trace id is invalid).
std::string trace_id_of(std::string_view traceparent);

class AccessLog {
 public:
  // Records waiting at most; past it they are dropped.
  static constexpr std::size_t kDefaultCapacity = 16384;

  // `target` is a file path (opened for appending, created 0640) or
  // "stderr". Fails with a message naming the file when it cannot be
  // opened.
  static Result<std::unique_ptr<AccessLog>> open(const std::string& target, AccessLogFormat format,
                                                 std::size_t capacity = kDefaultCapacity);
  // Why open() would fail for `target`, found without creating or
  // writing anything (--check-config): the file is not writable, or is
  // missing and its folder is not. Nothing when it would open.
  static std::optional<std::string> problem(const std::string& target);
  AccessLog(const AccessLog&) = delete;
  AccessLog& operator=(const AccessLog&) = delete;
  // Writes what is queued, then stops the writer.
  ~AccessLog();

  // Queues the record; drops (and counts) it when the queue is full.
  void submit(RequestRecord&& r);

  // Opens the file again at its path (SIGUSR1, once logrotate renamed
  // it): lines queued before go to the old file, later ones to the new.
  // Done by the writer thread; a path that cannot be opened keeps the old
  // file (and says so in the log). Nothing for "stderr".
  void reopen();

  std::uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  std::uint64_t written() const { return written_.load(std::memory_order_relaxed); }

 private:
  AccessLog(std::FILE* out, std::string target, AccessLogFormat format, std::size_t capacity);
  void run();
  void reopen_now();  // on the writer thread

  std::FILE* out_;
  const std::string target_;  // the path; "stderr" when not a file
  const bool owned_;
  const AccessLogFormat format_;
  const std::size_t capacity_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<RequestRecord> queue_;
  bool stop_ = false;
  bool reopen_ = false;
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> written_{0};
  std::thread writer_;
};

}  // namespace pdgate
