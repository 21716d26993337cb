// An OTLP/HTTP receiver inside the test process: a loopback listener on
// its own thread that collects the JSON bodies POSTed to it, answering
// 200 or (stalled) never answering, so tests can check what pdgate
// exports and that a receiver that hangs costs the gateway nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/harness.hpp"

namespace pdgate::test {

class OtlpReceiver {
 public:
  enum class Mode { answer, stall };
  explicit OtlpReceiver(Mode mode = Mode::answer);
  ~OtlpReceiver();
  OtlpReceiver(const OtlpReceiver&) = delete;
  OtlpReceiver& operator=(const OtlpReceiver&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Every span of every export request received so far.
  std::vector<Json> spans();
  // The spans of one trace (lowercase hex id).
  std::vector<Json> trace(const std::string& trace_id);
  std::size_t requests();

 private:
  void run();

  Mode mode_;
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> bodies_;
  std::thread thread_;
};

}  // namespace pdgate::test
