// The gateway process: worker threads, each with its own io_context and
// its own listening socket on the shared port (SO_REUSEPORT lets the kernel
// spread connections), the client sessions, and shutdown on signals.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "core/config.hpp"
#include "core/instance.hpp"
#include "core/worker.hpp"

namespace pdgate {

class Gateway {
 public:
  // `make_picker` builds each worker's instance picker (default:
  // round-robin).
  explicit Gateway(Config cfg, std::unique_ptr<ConversationStores> conversations,
                   PickerFactory make_picker = RoundRobinPicker::factory());
  ~Gateway();

  const Registry& registry() const { return registry_; }

  // Binds the listeners; returns an error message if the port is taken.
  Result<std::uint16_t> bind();
  // Runs until SIGINT/SIGTERM (graceful: stop accepting, let in-flight
  // requests finish up to the drain deadline). Returns the exit code.
  int run();

 private:
  struct Worker;
  net::awaitable<void> accept_loop(Worker& worker);
  net::awaitable<void> session(Worker& worker, tcp::socket socket);
  void stop_gracefully();

  Config cfg_;
  Registry registry_;
  PickerFactory make_picker_;
  // Before workers_: the workers' store handles refer to it.
  std::unique_ptr<ConversationStores> conversations_;
  std::atomic<std::int64_t> active_requests_{0};
  std::atomic<bool> stopping_{false};
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace pdgate
