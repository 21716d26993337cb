#include "core/pipeline/request_hook_phase.hpp"
#include "core/pipeline/forwarded_headers.hpp"

#include <spdlog/spdlog.h>
#include <boost/beast/core/string.hpp>

namespace pdgate {

bool one_hop_for(const Config& cfg, const KvConnector& connector, RoutePath chosen) {
  const bool configured = cfg.prefill_disabled || !connector.has_prefill();
  if (configured || chosen != RoutePath::one_hop)
    return configured;
  return !connector.names_peers();
}

std::optional<GatewayError> hook_refusal(RequestDecision& d) {
  if (d.failed_closed) {
    GatewayError e =
        policy_error(0, "the request policy failed", "request hook failed: " + d.error);
    e.reason = "request:error";
    return e;
  }
  if (d.reject_status != 0) {
    GatewayError e = policy_error(d.reject_status, std::move(d.reject_message));
    e.headers = std::move(d.reject_headers);
    e.reason = "request:rejected";
    return e;
  }
  return std::nullopt;
}

void apply_header_edits(ForwardedHeaders& fwd, const std::vector<HeaderEdit>& edits) {
  for (const HeaderEdit& e : edits) {
    if (header_edit_error(e.name, e.value ? &*e.value : nullptr))
      continue;
    std::erase_if(fwd.extra, [&](const auto& h) { return beast::iequals(h.first, e.name); });
    std::erase_if(fwd.policy_set, [&](const auto& h) { return beast::iequals(h.first, e.name); });
    if (e.value)
      fwd.policy_set.emplace_back(e.name, *e.value);
  }
}

bool use_edited_body(RequestContext& rc, std::string edited, const char* what) {
  auto index = index_json_object(edited);
  if (!index) {
    // Edits splice values into a valid object: this is a bug.
    spdlog::error("request {}: {} broke the JSON: {}", rc.request_id(), what, index.error());
    return rc.fail(gateway_error(ErrorKind::internal, "internal error editing the request body"));
  }
  rc.hooked_body = std::move(edited);
  rc.body = rc.hooked_body;
  rc.index = std::move(*index);
  // Views into the body follow it to the edited text.
  rc.pick().prompt_raw = raw_member(rc.body, rc.index, prompt_member(rc.api)).value_or("");
  return true;
}

bool request_hook_phase(RequestContext& rc) {
  RequestHookInput in;
  in.request_id = rc.request_id();
  in.body = rc.body;
  in.index = &rc.index;
  in.is_chat = rc.is_chat;
  in.model = rc.facts.model;
  in.stream = rc.facts.stream;
  in.prompt_bytes = rc.facts.prompt_bytes;
  in.for_each_header = rc.pick().for_each_header;
  in.header_source = rc.pick().header_source;
  in.key = rc.client_key;
  in.serial = rc.pick().serial;
  rc.pick().key = rc.client_key;
  RequestDecision d;
  if (rc.w.picker.on_request(in, d)) {
    if (auto refused = hook_refusal(d))
      return rc.fail(std::move(*refused));
    apply_header_edits(rc.fwd, d.headers);
    rc.rate_limits = std::move(d.rate_limits);
    if (auto edited = hooked_body(rc.body, rc.index, rc.api, d)) {
      if (!use_edited_body(rc, std::move(*edited), "the request hook's body edit"))
        return false;
    }
  }
  rc.one_hop = one_hop_for(rc.w.cfg, rc.connector, d.path);
  if (rc.outcome.record)
    rc.outcome.record->path = rc.one_hop ? "one_hop" : "pd";
  // One hop has no prefill to hand blocks to, and only NIXL's params can
  // name a previous turn's blocks: no reuse otherwise.
  rc.reuse = !rc.one_hop && rc.connector.passes_params();
  if (rc.w.metrics != nullptr)
    (rc.one_hop ? rc.w.metrics->path_one_hop : rc.w.metrics->path_pd)
        .fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace pdgate
