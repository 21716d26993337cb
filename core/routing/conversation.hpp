// Multi-turn KV reuse, the part the request pipeline calls
// (docs/conversations.md): which conversation a request belongs to and
// whose it is, the prefill params taken from the store when the request
// continues the stored turn's history (core/routing/turn_history.hpp), and the
// filter on decode's answer that captures decode's params for the next
// turn, fingerprints the answer, and hides the params from the client.
// Pure where possible; the two coroutines only add the store call and
// logging around the pure parts.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <nlohmann/json_fwd.hpp>

#include "core/base/json_body.hpp"
#include "core/net/sse.hpp"
#include "core/routing/conversation_store.hpp"
#include "core/routing/kv_params.hpp"
#include "core/routing/request_facts.hpp"
#include "core/routing/turn_history.hpp"

namespace pdgate {

// Longer ids are ignored (the request is served without reuse): a key is
// stored in every replica's store, so its size must be bounded.
inline constexpr std::size_t kMaxConversationIdBytes = 256;

// The conversation a request continues: the body's top-level
// `conversation_id` (as read_facts gives it), else the X-Conversation-Id
// header. Nullopt when neither is there, or it is empty or too long.
std::optional<std::string> conversation_key(
    const boost::beast::http::request<boost::beast::http::string_body>& req,
    const RequestFacts& facts);

// Who a request speaks for, as far as reuse is concerned.
struct ClientIdentity {
  // The client's API key (--api-keys) by name; empty when keys are off.
  std::string_view key_name;
  // --conversation-scope-header, lowercase; empty when not set.
  std::string_view scope_header;
  // --conversation-anonymous-reuse: a request that names no one shares
  // one anonymous scope (true) or gets no reuse (false).
  bool anonymous_reuse = true;
};

// Whose conversations a request may continue: the client's own identity,
// never a credential the gateway adds for it (OPENAI_API_KEY). In order:
// the client's API key when keys are on (narrowed by the scope header
// when one is configured and present); else the configured scope header's
// value, trimmed; else (no header configured) the Authorization the
// client sent; else the anonymous scope, or nullopt when anonymous reuse
// is off. Every part carries its kind's name, so the modes never land on
// each other's entries.
std::optional<std::string> conversation_scope(
    const boost::beast::http::request<boost::beast::http::string_body>& req,
    const ClientIdentity& who);

// What a turn carries from the prefill to the end of decode's answer: its
// store key and the running fingerprint its answer extends.
struct ConversationTurn {
  std::string store_key;
  TurnRecorder recorder;

  ConversationTurn fork() const { return {store_key, recorder.fork()}; }
};
// The turn of a request whose answer may be stored, or none.
using OptionalTurn = std::optional<ConversationTurn>;

// The request, as read_history needs it.
struct TurnRequest {
  std::optional<std::string> conversation_id;  // nullopt: no reuse asked for
  std::optional<std::string> scope;            // conversation_scope()
  std::string_view body;                       // the client's body as received
  const JsonObjectIndex* index = nullptr;      // its index
  bool is_chat = true;
};

// Sits between decode and the client. Fed each SSE event of a streaming
// answer, or the whole body of a non-streaming one, it captures decode's
// `kv_transfer_params` (when present and not null) rewritten for the next
// turn's prefill (remote_host = the decode's host, do_remote_decode true,
// do_remote_prefill false), and removes them from what the client gets
// unless `expose` is set: they name internal hosts and block ids.
//
// Only events whose data contains the text "kv_transfer_params" are
// parsed; every other event passes through as the very same bytes, with no
// copy.
class DecodeOutputFilter {
 public:
  // `recorder`, when set, is fed decode's answer (every event's data, or
  // the body) so the turn's fingerprint covers it; it must outlive the
  // filter.
  DecodeOutputFilter(std::string decode_host, bool expose, TurnRecorder* recorder = nullptr);

  // The bytes to relay for `event`: `event.raw` itself, or a rewritten
  // event held by the filter (valid until the next call).
  std::string_view on_event(const SseEvent& event);

  // A whole JSON body, rewritten in place when it carried params.
  void on_body(std::string& body);

  // The params for the next turn's prefill, if decode issued any.
  const std::optional<std::string>& captured() const { return captured_; }

  // True once after each capture, so the relay can store the params before
  // it forwards the event that carried them (see docs/conversations.md:
  // the client must not be able to start its next turn before they are
  // stored).
  bool take_new_capture() { return std::exchange(fresh_, false); }

 private:
  // Captures from `json`; returns the text without the params when they
  // should be stripped and were present.
  std::optional<std::string> inspect(std::string_view json);
  // The same for a Responses API event, whose params sit in its
  // `response` object (response.completed); nothing is captured there.
  std::optional<std::string> strip_from_response(std::string_view json) const;

  std::string host_;
  bool expose_;
  TurnRecorder* recorder_;
  std::optional<std::string> captured_;
  bool fresh_ = false;
  std::string out_;
};

// Before the prefill: the kv_transfer_params to send it. They are the
// previous turn's decode params when the store holds an entry for this
// scope and conversation and the request's history begins exactly with
// that entry's history and answer (a hit); otherwise the default "export
// your blocks" params: a miss counted by reason (scope: no client
// identity; none: nothing stored; history: the entry was made for another
// history, and is used up), or a store error. Sets `turn` when this turn's
// answer can be stored for the next one. Never fails the request.
net::awaitable<std::string> prefill_kv_params_for_turn(ConversationStore& store,
                                                       ConversationCounters& counters,
                                                       const TurnRequest& request,
                                                       OptionalTurn& turn,
                                                       const std::string& request_id);

// After decode issued params (filter.take_new_capture()): stores them with
// the turn's fingerprint for the conversation's next turn, unless the
// answer cannot be fingerprinted. Bounded by the store's own timeout.
net::awaitable<void> remember_turn(ConversationStore& store, const ConversationTurn& turn,
                                   const std::string& params, std::chrono::seconds ttl,
                                   const std::string& request_id);

// The "conversation_store" object of /health.
nlohmann::json conversation_store_json(const ConversationStores& stores);

}  // namespace pdgate
