// Which stored turn a request may continue (docs/conversations.md, "Who
// may reuse a turn"). A conversation's decode blocks hold the KV of one
// exact history: the earlier turn's prompt and the answer decode produced.
// Handing them to a prefill whose prompt does not begin with that history
// computes the new turn on the wrong cache, and handing them to another
// client leaks the first client's conversation. So an entry is stored under
// a key derived from the client's identity (its scope) and the
// conversation id, and it carries a fingerprint of its history; a request
// reuses it only when its own history begins with exactly that.
//
// Everything here is pure: the store calls and the pipeline glue live in
// core/routing/conversation.*.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/base/json_body.hpp"
#include "core/base/sha256.hpp"

namespace pdgate {

// Past this much answer text a turn is not stored: the next request would
// have to carry (and the gateway decode) the whole answer to prove it
// continues it.
inline constexpr std::size_t kMaxFingerprintedAnswerBytes = 1u << 20;

// The store key of (scope, conversation id): lowercase hex SHA-256 of both,
// length-prefixed. It reveals neither, is the same on every replica, and a
// client cannot pick an id that lands on another scope's key. `scope` is
// what conversation_scope() returned. Nullopt if libcrypto failed.
std::optional<std::string> conversation_store_key(std::string_view scope,
                                                  std::string_view conversation_id);

enum class TurnKind { chat, completion };

// What the store holds for a conversation: the params the next prefill
// reads, and the turn they were made for.
struct StoredTurn {
  TurnKind kind = TurnKind::chat;
  // Chat: how many messages the turn's request had (the answer follows
  // them). Completions: bytes of prompt plus generated text.
  std::uint64_t extent = 0;
  std::string fingerprint;  // 64 lowercase hex digits
  std::string params;       // decode's kv_transfer_params, rewritten for the prefill
};

// `{"v":2,"kind":"chat","n":3,"fp":"…","params":{…}}`: a few hundred bytes.
std::string encode_stored_turn(const StoredTurn& turn);

// Nullopt unless `value` is exactly what encode_stored_turn writes (a
// previous version's bare params object included: its history is unknown).
std::optional<StoredTurn> decode_stored_turn(std::string_view value);

// The running fingerprint of one turn: the request's history first, then
// decode's answer as it streams through the gateway. Holds a hash state
// and a few counters, whatever the size of the history or the answer.
class TurnRecorder {
 public:
  TurnRecorder(TurnKind kind, std::uint64_t history_extent, Sha256 state);

  // A recorder in this one's state, for another attempt at the same turn
  // (a decode retried elsewhere answers afresh).
  TurnRecorder fork() const;

  // One SSE event's data (a chat.completion.chunk or text_completion
  // chunk); anything that is not a JSON object ([DONE]) is ignored.
  void on_chunk(std::string_view json);
  // A whole non-streaming answer.
  void on_body(std::string_view json);

  // The entry to store with `params`, or nullopt when the answer cannot be
  // one a client sends back verbatim as the next turn's history (several
  // choices, tool calls, reasoning, an error, more than
  // kMaxFingerprintedAnswerBytes) or hashing failed.
  std::optional<StoredTurn> entry(std::string params) const;

  bool spoiled() const { return spoiled_; }
  std::uint64_t answer_bytes() const { return answer_bytes_; }

 private:
  // `choice` is one element of "choices"; `field` is "delta" or "message"
  // for chat, unused for completions.
  void on_choice(std::string_view choice, std::string_view field);
  void add_answer(std::string_view text);

  TurnKind kind_;
  std::uint64_t history_extent_;  // messages (chat) or prompt bytes (completions)
  Sha256 state_;
  std::uint64_t answer_bytes_ = 0;
  bool spoiled_ = false;
};

// A request's history read against the entry it might continue.
struct HistoryReading {
  // This turn's fingerprint so far, for its answer to extend; nullopt when
  // the request's turn cannot be fingerprinted (a completions prompt that
  // is not one string, `echo`, hashing failed).
  std::optional<TurnRecorder> own;
  // The request's history begins exactly with `previous`'s history and
  // answer (always false without `previous`).
  bool continues = false;
};

// One pass over the request's messages (or prompt): it hashes them once,
// forking the hash where `previous`'s history ends to check it. `body` is
// the client's body as received and `index` its index.
HistoryReading read_history(std::string_view body, const JsonObjectIndex& index, bool is_chat,
                            const StoredTurn* previous);

}  // namespace pdgate
