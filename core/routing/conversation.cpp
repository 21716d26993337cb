#include "core/routing/conversation.hpp"

#include <utility>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "core/base/http_tokens.hpp"
#include "core/base/json_body.hpp"
#include "core/base/json_edit.hpp"

namespace pdgate {

namespace {

constexpr std::string_view kParamsKey = "kv_transfer_params";

// Where `json` ends in `,"kv_transfer_params":null}` and names the key
// nowhere else: the compact form engines send on every answer without
// params (vLLM's and the sim's serializers). Then that text is the
// object's last member (a valid object's final `}` is outside any string,
// so is the `null` before it, and a quote preceded by a comma opens the
// key) and it is its only kv_transfer_params: it can be cut out without
// indexing the body. Anything else (spaces, other members after it,
// params that are not null) is left to the full parse.
constexpr std::string_view kNullParamsTail = R"(,"kv_transfer_params":null})";

std::optional<std::size_t> lone_null_params_at(std::string_view json) {
  while (!json.empty() &&
         (json.back() == ' ' || json.back() == '\n' || json.back() == '\r' || json.back() == '\t'))
    json.remove_suffix(1);
  if (json.size() < kNullParamsTail.size() + 1 || !json.ends_with(kNullParamsTail))
    return std::nullopt;
  const std::size_t at = json.size() - kNullParamsTail.size();
  if (json.find(kParamsKey) != at + 2)  // after `,"`
    return std::nullopt;
  return at;
}

std::optional<std::string> bounded(std::string_view id) {
  if (id.empty() || id.size() > kMaxConversationIdBytes)
    return std::nullopt;
  return std::string(id);
}

}  // namespace

std::optional<std::string> conversation_key(
    const boost::beast::http::request<boost::beast::http::string_body>& req,
    const RequestFacts& facts) {
  if (facts.conversation_id)
    return bounded(*facts.conversation_id);
  auto it = req.find("x-conversation-id");
  if (it == req.end())
    return std::nullopt;
  return bounded(http_tokens::trim_ows(it->value()));
}

std::optional<std::string> conversation_scope(
    const boost::beast::http::request<boost::beast::http::string_body>& req,
    const ClientIdentity& who) {
  const auto header = [&req](std::string_view name) {
    auto it = req.find(name);
    return it == req.end() ? std::string_view() : http_tokens::trim_ows(it->value());
  };
  // "kind\0length:value" parts: a kind holds no NUL and the length ends
  // the value, so no two lists of parts give the same text.
  std::string scope;
  const auto part = [&scope](std::string_view kind, std::string_view value) {
    scope.append(kind).push_back('\0');
    scope.append(std::to_string(value.size())).push_back(':');
    scope.append(value);
  };
  const std::string_view tenant =
      who.scope_header.empty() ? std::string_view() : header(who.scope_header);
  if (!who.key_name.empty()) {
    part("api-key", who.key_name);
    if (!tenant.empty())
      part(who.scope_header, tenant);
  } else if (!who.scope_header.empty()) {
    if (!tenant.empty())
      part(who.scope_header, tenant);
  } else if (const auto credential = header("authorization"); !credential.empty()) {
    part("authorization", credential);
  }
  if (!scope.empty())
    return scope;
  if (!who.anonymous_reuse)
    return std::nullopt;
  part("anonymous", "");
  return scope;
}

DecodeOutputFilter::DecodeOutputFilter(std::string decode_host, bool expose, TurnRecorder* recorder)
    : host_(std::move(decode_host)), expose_(expose), recorder_(recorder) {}

std::optional<std::string> DecodeOutputFilter::inspect(std::string_view json) {
  if (const auto at = lone_null_params_at(json)) {
    // Null: nothing to capture (decode kept no blocks), only to strip.
    if (expose_)
      return std::nullopt;
    std::string out;
    out.reserve(json.size());
    out.append(json.substr(0, *at));
    out.append(json.substr(*at + kNullParamsTail.size() - 1));  // keeps the `}`
    return out;
  }
  const auto index = index_json_object(json);
  if (!index)
    return std::nullopt;  // not ours to judge: relay as it came
  const auto raw = raw_member(json, *index, kParamsKey);
  if (!raw)
    return std::nullopt;
  if (!raw->empty() && raw->front() == '{') {
    if (auto next = kv_params_for_next_turn_prefill(*raw, host_)) {
      captured_ = std::move(*next);
      fresh_ = true;
    }
  }
  if (expose_)
    return std::nullopt;
  JsonBodyEditor editor(json, *index);
  editor.remove(kParamsKey);
  return editor.render();
}

std::optional<std::string> DecodeOutputFilter::strip_from_response(std::string_view json) const {
  if (expose_)
    return std::nullopt;
  const auto index = index_json_object(json);
  if (!index)
    return std::nullopt;
  const auto response = raw_member(json, *index, "response");
  if (!response || response->empty() || response->front() != '{')
    return std::nullopt;
  const auto inner = index_json_object(*response);
  if (!inner || !raw_member(*response, *inner, kParamsKey))
    return std::nullopt;
  JsonBodyEditor inner_editor(*response, *inner);
  inner_editor.remove(kParamsKey);
  JsonBodyEditor editor(json, *index);
  editor.set("response", inner_editor.render());
  return editor.render();
}

std::string_view DecodeOutputFilter::on_event(const SseEvent& event) {
  if (recorder_ != nullptr && event.has_data)
    recorder_->on_chunk(event.data);
  if (!event.has_data || event.data.find(kParamsKey) == std::string::npos)
    return event.raw;
  auto stripped = inspect(event.data);
  if (!stripped)
    stripped = strip_from_response(event.data);
  if (!stripped)
    return event.raw;
  // The event's other fields (a Responses event's `event:` name) are kept
  // as they came, before its one rewritten data field.
  out_.clear();
  std::string_view rest = event.raw;
  while (!rest.empty()) {
    const std::size_t eol = rest.find_first_of("\r\n");
    const std::string_view line = rest.substr(0, eol);
    if (line.empty())
      break;  // the blank line that ends the event
    std::size_t next = eol == std::string_view::npos ? rest.size() : eol + 1;
    if (eol != std::string_view::npos && rest[eol] == '\r' && next < rest.size() &&
        rest[next] == '\n')
      ++next;
    if (line.substr(0, line.find(':')) != "data") {
      out_.append(line);
      out_.push_back('\n');
    }
    rest.remove_prefix(next);
  }
  out_ += sse_data_event(*stripped);
  return out_;
}

void DecodeOutputFilter::on_body(std::string& body) {
  if (recorder_ != nullptr)
    recorder_->on_body(body);
  if (body.find(kParamsKey) == std::string::npos)
    return;
  if (auto stripped = inspect(body))
    body = std::move(*stripped);
}

net::awaitable<std::string> prefill_kv_params_for_turn(ConversationStore& store,
                                                       ConversationCounters& counters,
                                                       const TurnRequest& request,
                                                       OptionalTurn& turn,
                                                       const std::string& request_id) {
  turn.reset();
  if (!request.conversation_id) {
    spdlog::debug("request {}: no conversation_id; no multi-turn KV reuse", request_id);
    co_return std::string(kDefaultPrefillKvParams);
  }
  const std::string& id = *request.conversation_id;
  if (!request.scope) {
    counters.add(counters.misses_scope);
    spdlog::debug("request {}: conversation {}: no client identity to scope it by; no reuse",
                  request_id, id);
    co_return std::string(kDefaultPrefillKvParams);
  }
  auto key = conversation_store_key(*request.scope, id);
  if (!key) {
    counters.add(counters.errors);
    co_return std::string(kDefaultPrefillKvParams);
  }
  TakeResult taken = co_await store.take(*key);
  std::optional<StoredTurn> previous;
  // An entry was there: this version's, or a previous version's bare
  // params (a JSON object that records no history).
  bool found = false;
  switch (taken.kind) {
    case TakeResult::Kind::hit:
      previous = decode_stored_turn(taken.params);
      found = previous || index_json_object(taken.params);
      if (!found) {
        counters.add(counters.errors);
        spdlog::debug("request {}: conversation {}: stored value is not JSON; ignored", request_id,
                      id);
      }
      break;
    case TakeResult::Kind::miss:
      spdlog::debug("request {}: conversation {}: nothing cached", request_id, id);
      break;
    case TakeResult::Kind::error:
      // The store warned (rate-limited); the turn just recomputes.
      spdlog::debug("request {}: conversation {}: store error: {}", request_id, id, taken.detail);
      break;
  }
  HistoryReading reading =
      read_history(request.body, *request.index, request.is_chat, previous ? &*previous : nullptr);
  if (reading.own)
    turn.emplace(ConversationTurn{std::move(*key), std::move(*reading.own)});
  if (previous && reading.continues) {
    counters.add(counters.hits);
    spdlog::debug("request {}: conversation {}: reusing the previous turn's decode blocks",
                  request_id, id);
    co_return std::move(previous->params);
  }
  if (found) {
    // An entry of this client's conversation made for another history (an
    // edit, a regenerate, another branch), or by a previous version that
    // recorded none: its blocks are not this prompt's prefix.
    counters.add(counters.misses_history);
    spdlog::debug("request {}: conversation {}: the request does not continue the cached turn",
                  request_id, id);
  }
  co_return std::string(kDefaultPrefillKvParams);
}

net::awaitable<void> remember_turn(ConversationStore& store, const ConversationTurn& turn,
                                   const std::string& params, std::chrono::seconds ttl,
                                   const std::string& request_id) {
  auto entry = turn.recorder.entry(params);
  if (!entry) {
    spdlog::debug("request {}: the answer cannot be fingerprinted ({} bytes, {}); not stored",
                  request_id, turn.recorder.answer_bytes(),
                  turn.recorder.spoiled() ? "not plain text of one choice" : "hashing failed");
    co_return;
  }
  const bool ok = co_await store.put(turn.store_key, encode_stored_turn(*entry), ttl);
  spdlog::debug("request {}: decode params {}", request_id,
                ok ? "stored for the next turn" : "not stored");
}

nlohmann::json conversation_store_json(const ConversationStores& stores) {
  const auto h = stores.health();
  const auto& c = stores.counters();
  auto load = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  const auto none = load(c.misses_none);
  const auto history = load(c.misses_history);
  const auto scope = load(c.misses_scope);
  nlohmann::json j = {
      {"kind", h.kind},
      {"reachable", h.reachable},
      {"hits", load(c.hits)},
      {"misses", none + history + scope},
      {"misses_by_reason", {{"none", none}, {"history", history}, {"scope", scope}}},
      {"expired", load(c.expired)},
      {"evicted", load(c.evicted)},
      {"errors", load(c.errors)},
      {"puts", load(c.puts)}};
  if (!h.endpoint.empty())
    j["endpoint"] = h.endpoint;
  j["entries"] = h.entries ? nlohmann::json(*h.entries) : nlohmann::json(nullptr);
  return j;
}

}  // namespace pdgate
