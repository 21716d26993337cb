// Where KV blocks probably live: which engine instances recently received
// which prompt prefix blocks, and which instances served each
// conversation's last turn. Routing policies read it inside a pick
// (pdgate.prefix_matches(), pdgate.conversation()) and write to it after
// one, so a lookup must be local and cheap: an implementation that shares
// its records with other gateway replicas does so in the background and
// answers from memory.
//
// Instances are named by an InstanceKey derived from their normalized URL,
// not by the registry's numeric id: every replica numbers its instances on
// its own, so only the URL means the same engine everywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace pdgate {

// 0 means "no instance".
using InstanceKey = std::uint64_t;

// FNV-1a over the normalized URL ("http://host:port"): the same engine
// gets the same key on every replica. A URL never maps to 0.
inline InstanceKey instance_key(std::string_view normalized_url) {
  std::uint64_t h = 14695981039346656037ull;
  for (const char c : normalized_url) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

// Which decode (and prefill) served a conversation's last turn.
struct ConversationRoute {
  InstanceKey decode = 0;
  InstanceKey prefill = 0;
  std::int64_t at_ms = 0;  // steady clock of this process
};

class KvLocationIndex {
 public:
  virtual ~KvLocationIndex() = default;

  // `hashes` (a prompt's chained prefix block hashes, policies/prefix_hash.hpp)
  // were routed to `where` at `now_ms` (steady clock).
  virtual void record_prefix(const std::vector<std::uint64_t>& hashes, InstanceKey where,
                             std::int64_t now_ms) = 0;
  // For each instance that recently received a prefix of `hashes`, the
  // number of leading blocks it received. Stops early once `enough`
  // instances are found. Never waits on the network.
  virtual std::vector<std::pair<InstanceKey, std::size_t>> prefix_matches(
      const std::vector<std::uint64_t>& hashes, std::int64_t now_ms, std::size_t enough) const = 0;

  virtual void record_conversation(std::string_view conversation_id,
                                   const ConversationRoute& route) = 0;
  virtual std::optional<ConversationRoute> conversation(std::string_view conversation_id) const = 0;

  // The instance is gone (removed from the registry): what it was sent
  // before `now_ms` no longer counts as cached there, even if it comes
  // back with the same URL (a restarted engine starts with an empty cache).
  virtual void forget_instance(InstanceKey key, std::int64_t now_ms) = 0;
};

}  // namespace pdgate
