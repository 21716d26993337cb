// Multi-turn KV reuse, the part the request pipeline calls
// (docs/conversations.md): which conversation a request belongs to, the
// prefill params taken from the store, and the filter on decode's answer
// that captures decode's params for the next turn and hides them from the
// client. Pure where possible; the two coroutines only add the store call
// and logging around the pure parts.
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

#include "core/body_rewrite.hpp"
#include "core/sse.hpp"
#include "plugins/conversation_store.hpp"

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

// The prefill's kv_transfer_params from a taken store entry (decode's
// params of the previous turn, already rewritten when they were stored):
// checked again here, because Redis is shared and its values are not ours
// alone. Nullopt when the entry is not a JSON object.
std::optional<std::string> prefill_kv_params_from_entry(std::string_view entry);

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
  DecodeOutputFilter(std::string decode_host, bool expose);

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

  std::string host_;
  bool expose_;
  std::optional<std::string> captured_;
  bool fresh_ = false;
  std::string out_;
};

// Before the prefill: the kv_transfer_params to send it. On a store hit
// they are the previous turn's decode params; on a miss, a store error, an
// unusable entry or no conversation key, the default "export your blocks"
// params. Never fails the request.
net::awaitable<std::string> prefill_kv_params_for_turn(ConversationStore& store,
                                                       ConversationCounters& counters,
                                                       const std::optional<std::string>& key,
                                                       const std::string& request_id);

// After decode issued params (filter.take_new_capture()): stores them for
// the conversation's next turn. Bounded by the store's own timeout.
net::awaitable<void> remember_turn(ConversationStore& store, const std::string& key,
                                   const std::string& params, std::chrono::seconds ttl,
                                   const std::string& request_id);

// The "conversation_store" object of /health.
nlohmann::json conversation_store_json(const ConversationStores& stores);

}  // namespace pdgate
