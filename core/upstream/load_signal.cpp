#include "core/upstream/load_signal.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

namespace pdgate {

LoadChangeSignal::LoadChangeSignal() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

LoadChangeSignal::~LoadChangeSignal() {
  if (fd_ >= 0)
    ::close(fd_);
}

void LoadChangeSignal::notify() const noexcept {
  if (fd_ < 0 || !armed_.exchange(false, std::memory_order_acq_rel))
    return;
  const std::uint64_t one = 1;
  // Non-blocking: it fails only if the counter would overflow, which a
  // listener reading each wake-up never lets happen; either way the
  // listener's next poll reports the change.
  [[maybe_unused]] const auto n = ::write(fd_, &one, sizeof one);
}

void LoadChangeSignal::take() const noexcept {
  if (fd_ < 0)
    return;
  std::uint64_t count = 0;
  [[maybe_unused]] const auto n = ::read(fd_, &count, sizeof count);
}

}  // namespace pdgate
