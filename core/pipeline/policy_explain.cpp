#include "core/pipeline/policy_explain.hpp"

#include <chrono>

#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "core/base/http_tokens.hpp"
#include "core/base/json_body.hpp"
#include "core/net/errors.hpp"
#include "core/pipeline/engine_errors.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/request_hook_phase.hpp"
#include "core/routing/conversation.hpp"
#include "core/routing/request_facts.hpp"
#include "core/routing/request_hook.hpp"
#include "core/upstream/load_model.hpp"

namespace pdgate {
namespace {

using json = nlohmann::json;
namespace http = boost::beast::http;

std::int64_t steady_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What the client would get for `e`: status, message, the policy's headers
// and the access log's reason.
json answer_json(const GatewayError& e) {
  json headers = json::object();
  for (const auto& [name, value] : e.headers)
    headers[name] = value;
  return {{"status", status_of(e)},
          {"message", e.message},
          {"detail", e.detail.empty() ? json(nullptr) : json(e.detail)},
          {"reject", e.reason.empty() ? json(nullptr) : json(e.reason)},
          {"headers", headers}};
}

json number_at(const std::vector<std::int64_t>& v, std::size_t i, bool negative_is_none = false) {
  if (i >= v.size() || (negative_is_none && v[i] < 0))
    return nullptr;
  return v[i];
}

json candidate_json(const Instance& i, std::size_t pos, const PickExplanation* e,
                    std::int64_t now_ms) {
  json j = {{"id", i.id},
            {"url", i.spec.url},
            {"role", to_string(i.spec.role)},
            {"labels", *i.labels()},
            {"healthy", i.healthy.load()},
            {"load", routing_load(i, now_ms)},
            {"in_flight", i.in_flight.load()},
            {"cluster_in_flight", i.cluster_in_flight()},
            {"queued_tokens", i.cluster_queued_tokens()}};
  if (e != nullptr) {
    j["prefix_blocks"] = number_at(e->prefix_blocks, pos);
    j["exact_cached_tokens"] = number_at(e->exact_tokens, pos, true);
    j["cached_tokens"] = number_at(e->cached_tokens, pos);
  }
  return j;
}

// The policy's own part of an explanation: name, version, outcome, log.
void explanation_fields(json& j, const PickExplanation* e) {
  if (e == nullptr)
    return;
  j["policy"] = e->policy;
  j["version"] = e->version;
  j["outcome"] = e->outcome;
  if (!e->error.empty())
    j["error"] = e->error;
  if (e->fallback)
    j["fallback"] = "round_robin";
  if (e->rechecked)
    j["rechecked"] = true;  // pdgate.RECHECK first; the answer is the second pick's
  j["log"] = e->log;
}

// One stage's pick as the pipeline makes it; `chosen` null when the
// request ends there (`answer` then says how).
json explain_pick(InstancePicker& dry, const std::vector<InstancePtr>& candidates,
                  const PickContext& ctx, InstancePtr& chosen, std::optional<json>& answer) {
  chosen = dry.pick(candidates, ctx);
  const PickExplanation* e = dry.last_explanation();
  json j = {{"stage", to_string(ctx.stage)}};
  explanation_fields(j, e);
  if (e != nullptr)
    j["prompt_blocks"] = e->prompt_blocks;
  const std::int64_t now = steady_ms_now();
  json list = json::array();
  for (std::size_t i = 0; i < candidates.size(); ++i)
    list.push_back(candidate_json(*candidates[i], i, e, now));
  j["candidates"] = std::move(list);
  j["pick"] = chosen ? json{{"id", chosen->id}, {"url", chosen->spec.url}} : json(nullptr);
  if (!chosen)
    answer = answer_json(no_instance(ctx.stage, dry));
  return j;
}

// The explain document's headers, checked as a client's would be.
std::optional<std::string> set_headers(http::request<http::string_body>& req, const json& h) {
  if (h.is_null())
    return std::nullopt;
  if (!h.is_object())
    return "headers must be an object of strings";
  if (h.size() > kMaxExplainHeaders)
    return "headers: at most " + std::to_string(kMaxExplainHeaders);
  for (const auto& [name, value] : h.items()) {
    if (!value.is_string())
      return "headers: the value of '" + name + "' must be a string";
    const auto& v = value.get_ref<const std::string&>();
    if (name.empty() || name.size() > 256 || !http_tokens::is_token(name))
      return "headers: '" + name + "' is not a header name";
    if (v.size() > kMaxExplainHeaderValue)
      return "headers: the value of '" + name + "' is longer than " +
             std::to_string(kMaxExplainHeaderValue) + " bytes";
    for (const char c : v) {
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
        return "headers: the value of '" + name + "' has a control character";
    }
    req.insert(name, v);
  }
  return std::nullopt;
}

std::optional<GenerationApi> api_of(std::string_view path) {
  if (path == "/v1/chat/completions")
    return GenerationApi::chat;
  if (path == "/v1/completions")
    return GenerationApi::completions;
  if (path == "/v1/responses")
    return GenerationApi::responses;
  return std::nullopt;
}

std::pair<unsigned, std::string> bad(std::string message) {
  return {400, std::move(message)};
}

std::pair<unsigned, std::string> dumped(const json& out) {
  return {200, out.dump(-1, ' ', false, json::error_handler_t::replace)};
}

// The hook's declared limits and how each stands (`v` null: not checked):
// where they were read (cluster: Redis; replica: this replica's store,
// `fallback` saying why Redis was not).
json limits_json(const std::vector<RateLimitDecl>& limits, const RateLimitVerdict* v) {
  json list = json::array();
  for (std::size_t i = 0; i < limits.size(); ++i) {
    const RateLimitDecl& l = limits[i];
    json j = {{"key", l.key},
              {"limit", l.limit},
              {"window_seconds", static_cast<double>(l.window_ms) / 1000.0}};
    if (v != nullptr && i < v->answers.size()) {
      const RateLimitAnswer& a = v->answers[i];
      j["allowed"] = a.allowed;
      j["count"] = a.count;
      j["retry_after_seconds"] = static_cast<double>(a.retry_after_ms) / 1000.0;
      j["store"] = v->cluster ? "cluster" : "replica";
      if (!v->fallback.empty())
        j["fallback"] = v->fallback;
    } else {
      j["allowed"] = nullptr;  // not checked (no store answered)
    }
    list.push_back(std::move(j));
  }
  return list;
}

}  // namespace

net::awaitable<std::pair<unsigned, std::string>> explain_request(std::string_view document,
                                                                 InstancePicker& dry,
                                                                 ExplainEnv env) {
  // Checked by the gateway's own validator first: it bounds the nesting
  // that the parser below would follow.
  if (auto ok = validate_json(document); !ok)
    co_return bad("not valid JSON: " + ok.error());
  const json doc = json::parse(document, nullptr, false);
  if (!doc.is_object())
    co_return bad("the document must be an object: {\"headers\": {...}, \"body\": {...}}");
  const auto path_it = doc.find("path");
  if (path_it != doc.end() && !path_it->is_string())
    co_return bad("path must be a string");
  const std::string path =
      path_it != doc.end() ? path_it->get<std::string>() : "/v1/chat/completions";
  const auto api = api_of(path);
  if (!api)
    co_return bad("path must be /v1/chat/completions, /v1/completions or /v1/responses");
  http::request<http::string_body> req{http::verb::post, path, 11};
  if (auto why = set_headers(req, doc.contains("headers") ? doc["headers"] : json(nullptr)))
    co_return bad(*why);
  const auto body_it = doc.find("body");
  if (body_it == doc.end() || !(body_it->is_object() || body_it->is_string()))
    co_return bad("body must be the request's JSON object (or its text)");
  req.body() = body_it->is_string() ? body_it->get<std::string>() : body_it->dump();
  const std::string_view body = req.body();

  json out = json::object();
  // The client's key, looked up without admitting anything: no limit is
  // counted.
  ClientKeyPtr key;
  if (env.keys != nullptr) {
    const auto auth = req.find(http::field::authorization);
    const std::string_view presented =
        auth == req.end() ? std::string_view() : bearer_token(auth->value());
    key = env.keys->find(presented);
    if (!key) {
      out["answer"] = answer_json(
          client_error(ErrorKind::unauthenticated,
                       presented.empty() ? "no API key given" : "incorrect API key provided"));
      co_return dumped(out);
    }
    out["key"] = {{"name", key->name}, {"labels", key->labels}};
  }
  auto index = index_json_object(body);
  if (!index)
    co_return bad("body: request body is not valid JSON: " + index.error());
  auto facts = read_facts(body, *index, *api);
  if (!facts)
    co_return bad("body: " + facts.error());

  const std::string request_id = [&] {
    const auto it = req.find("x-request-id");
    return it != req.end() && !it->value().empty() && it->value().size() <= 256
               ? std::string(it->value())
               : std::string("explain");
  }();
  PickContext ctx;
  ctx.model = facts->model;
  ctx.stream = facts->stream;
  ctx.is_chat = *api == GenerationApi::chat;
  ctx.prompt_raw = raw_member(body, *index, prompt_member(*api)).value_or("");
  ctx.conversation_id = conversation_key(req, *facts);
  ctx.header_source = &req;
  ctx.for_each_header = &policy_headers;
  ctx.request_id = request_id;
  ctx.serial = 1;  // the dry picker's state is this request's alone
  ctx.key = key.get();
  out["request"] = {
      {"model", facts->model},
      {"stream", facts->stream},
      {"prompt_bytes", facts->prompt_bytes},
      {"prompt_tokens", estimated_prompt_tokens(facts->prompt_bytes)},
      {"conversation_id", ctx.conversation_id ? json(*ctx.conversation_id) : json(nullptr)}};

  // The request hook.
  RequestHookInput in;
  in.request_id = request_id;
  in.body = body;
  in.index = &*index;
  in.is_chat = ctx.is_chat;
  in.model = facts->model;
  in.stream = facts->stream;
  in.prompt_bytes = facts->prompt_bytes;
  in.for_each_header = ctx.for_each_header;
  in.header_source = ctx.header_source;
  in.key = ctx.key;
  in.serial = ctx.serial;
  RequestDecision d;
  const bool ran = dry.on_request(in, d);
  json hook = {{"ran", ran}};
  if (ran) {
    explanation_fields(hook, dry.last_explanation());
    json set = json::object();
    for (const auto& e : d.headers)
      set[e.name] = e.value ? json(*e.value) : json(nullptr);
    hook["set_headers"] = std::move(set);
    hook["max_tokens_cap"] = d.max_tokens_cap ? json(*d.max_tokens_cap) : json(nullptr);
    hook["priority"] = d.priority ? json(*d.priority) : json(nullptr);
  }
  if (auto refused = hook_refusal(d)) {
    out["hook"] = std::move(hook);
    out["answer"] = answer_json(*refused);
    co_return dumped(out);
  }
  // The limits it declared, as the rate-limit phase would find them now;
  // nothing is counted.
  if (!d.rate_limits.empty()) {
    std::optional<RateLimitVerdict> v;
    if (env.rate_limiter != nullptr)
      v = co_await env.rate_limiter->check(d.rate_limits, false);
    hook["rate_limits"] = limits_json(d.rate_limits, v ? &*v : nullptr);
    if (v && !v->allowed()) {
      out["hook"] = std::move(hook);
      out["answer"] = answer_json(rate_limit_refusal(d.rate_limits, *v));
      co_return dumped(out);
    }
  }
  out["hook"] = std::move(hook);

  // The stages, in the pipeline's order (pipeline.cpp's serve_completion).
  const bool one_hop = one_hop_for(env.cfg, env.connector, d.path);
  out["path"] = one_hop ? "one_hop" : "pd";
  json stages = json::array();
  std::optional<json> answer;
  InstancePtr prefill, decode;
  const auto pick = [&](Stage s, const std::vector<InstancePtr>& candidates, InstancePtr& into) {
    ctx.stage = s;
    ctx.chosen_prefill = s == Stage::decode ? prefill.get() : nullptr;
    stages.push_back(explain_pick(dry, candidates, ctx, into, answer));
    return into != nullptr;
  };
  if (one_hop) {
    pick(Stage::decode, env.set.decode, decode);
  } else if (env.connector.names_peers()) {
    // The request id names both peers, so decode is chosen first.
    if (pick(Stage::decode, env.set.decode, decode))
      pick(Stage::prefill, env.set.prefill, prefill);
  } else if (pick(Stage::prefill, env.set.prefill, prefill)) {
    pick(Stage::decode, env.set.decode, decode);
  }
  out["stages"] = std::move(stages);
  out["answer"] = answer ? std::move(*answer) : json{{"routed", true}};
  co_return dumped(out);
}

}  // namespace pdgate
