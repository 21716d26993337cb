// Fault injection (faults.hpp): the faults a request meets before its work,
// and the ones that end a stream early.
#include "sim/faults.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/write.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <string>

namespace pdgate::sim {

namespace {

// --die-after-chunks / die-after=N: once N events went out, drop the
// connection without the terminating chunk, like a crashed engine.
bool maybe_die(Exchange& x) {
  if (!x.die_after || x.events_written < *x.die_after)
    return false;
  x.log.info("request {}: dying after {} data events (fault)", x.rid, x.events_written);
  ++x.counters.faults_injected;
  if (x.rec) {
    x.rec->outcome = Outcome::error;
    x.rec->ended_at_ms = now_ms();
  }
  x.sock.close();
  x.closed = true;
  return true;
}

// X-Sim-Fault error-after=N: vLLM's mid-stream failure, an error event
// then [DONE], with the chunked body properly terminated.
awaitable<void> fail_stream(Exchange& x) {
  x.log.info("request {}: failing the stream after {} data events (fault)", x.rid,
             x.events_written);
  ++x.counters.faults_injected;
  x.error_after.reset();
  std::string events =
      sse_event(make_error("Simulated engine failure mid-stream (pdgate-sim)", 500)) +
      std::string(kSseDone);
  auto [ec, n] =
      co_await net::async_write(x.sock, http::make_chunk(net::buffer(events)), use_nothrow);
  if (!ec) {
    auto [ec2, n2] = co_await net::async_write(x.sock, http::make_chunk_last(), use_nothrow);
    ec = ec2;
  }
  if (ec) {
    x.client_gone = true;
    co_return;
  }
  if (x.rec) {
    x.rec->outcome = Outcome::error;
    x.rec->ended_at_ms = now_ms();
  }
}

}  // namespace

awaitable<bool> Faults::hang(Exchange& x) {
  if (x.rec)
    x.rec->fault = "--hang";
  ++counters_.faults_injected;
  co_return co_await watched(x, hang_forever());
}

awaitable<bool> Faults::before_work(Exchange& x, const Fault& fault, bool stream) {
  if (fault.delay_ms > 0) {
    const std::chrono::milliseconds delay(fault.delay_ms);
    if (!co_await sleep_for(delay))
      co_return false;
  }
  for (std::size_t i = 0; i < fault.interim; ++i) {
    static constexpr std::string_view kEarlyHints =
        "HTTP/1.1 103 Early Hints\r\nLink: </sim.css>; rel=preload\r\n\r\n";
    auto [ec, n] = co_await net::async_write(x.sock, net::buffer(kEarlyHints), use_nothrow);
    if (ec) {
      x.client_gone = true;
      co_return false;
    }
  }
  if (fault.hang) {
    ++counters_.faults_injected;
    co_await hang_forever();
    co_return false;
  }
  if (fault.stall_body && !stream) {
    ++counters_.faults_injected;
    x.log.info("request {}: sending {} of {} body bytes, then stalling (fault)", x.rid,
               *fault.stall_body, *fault.stall_body + 1);
    std::string bytes = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                        std::to_string(*fault.stall_body + 1) + "\r\n\r\n";
    bytes.append(*fault.stall_body, ' ');
    auto [ec, n] = co_await net::async_write(x.sock, net::buffer(bytes), use_nothrow);
    std::string().swap(bytes);
    x.response_started = true;
    x.closed = true;  // the answer is never completed: the connection cannot be reused
    if (!ec)
      co_await hang_forever();  // until the client leaves (the caller watches)
    co_return false;
  }
  int error_status = fault.error_status.value_or(0);
  if (error_status == 0 && opts_.error_rate > 0 &&
      std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < opts_.error_rate) {
    error_status = 500;
    x.rec->fault = "--error-rate";
  }
  if (error_status != 0) {
    ++counters_.faults_injected;
    const std::string msg = "Simulated engine failure (pdgate-sim fault injection)";
    co_await send_error(x, error_status, msg);
    co_return false;
  }
  if (stream) {
    x.die_after = fault.die_after ? fault.die_after : opts_.die_after_chunks;
    x.error_after = fault.error_after;
    x.stall_after = fault.stall_after ? fault.stall_after : opts_.stall_after_chunks;
  }
  co_return true;
}

awaitable<bool> fire_stream_faults(Exchange& x) {
  if (maybe_die(x))
    co_return false;
  if (x.stall_after && x.events_written >= *x.stall_after) {
    // --stall-after-chunks / stall-after=N: the stream goes silent with
    // its connection open, until the client gives up and leaves.
    x.log.info("request {}: stalling after {} data events (fault)", x.rid, x.events_written);
    ++x.counters.faults_injected;
    x.stall_after.reset();
    x.closed = true;  // never completed: the connection cannot be reused
    co_await hang_forever();
    co_return false;
  }
  if (x.error_after && x.events_written >= *x.error_after) {
    co_await fail_stream(x);
    co_return false;
  }
  co_return true;
}

}  // namespace pdgate::sim
