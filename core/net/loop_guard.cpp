#include "core/net/loop_guard.hpp"

#include <cstdint>
#include <cstdio>
#include <random>

namespace pdgate {

namespace {

constexpr std::string_view kPrefix = "pdgate-";

// Whether `text` holds `token` as a whole word (not as part of a longer
// token that merely starts with it).
bool holds_token(std::string_view text, std::string_view token) {
  for (std::size_t at = text.find(token); at != std::string_view::npos;
       at = text.find(token, at + 1)) {
    const std::size_t end = at + token.size();
    const bool ends = end == text.size() || text[end] == ',' || text[end] == ' ' ||
                      text[end] == '\t' || text[end] == '(';
    const bool starts =
        at == 0 || text[at - 1] == ' ' || text[at - 1] == '\t' || text[at - 1] == ',';
    if (starts && ends)
      return true;
  }
  return false;
}

}  // namespace

LoopGuard::LoopGuard() {
  std::random_device rd;
  const std::uint64_t id = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  token_ = std::string(kPrefix) + buf;
}

std::string LoopGuard::via_for_upstream(std::string_view incoming) const {
  std::string v;
  v.reserve(incoming.size() + token_.size() + 6);
  if (!incoming.empty()) {
    v.append(incoming);
    v.append(", ");
  }
  v.append("1.1 ");
  v.append(token_);
  return v;
}

std::string LoopGuard::refusal(std::string_view via) const {
  if (via.empty())
    return {};
  if (holds_token(via, token_))
    return "request loop: this request has already passed through this gateway";
  std::size_t hops = 0;
  for (std::size_t at = via.find(kPrefix); at != std::string_view::npos;
       at = via.find(kPrefix, at + 1)) {
    if (++hops > kMaxPdgateHops) {
      return "request loop: this request has passed through more than " +
             std::to_string(kMaxPdgateHops) + " pdgate gateways";
    }
  }
  return {};
}

}  // namespace pdgate
