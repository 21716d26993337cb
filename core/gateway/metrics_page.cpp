// The gateway's /metrics page: every counter, gauge and histogram of the
// process, its instances, its stores and its keys, in Prometheus' text
// format (core/observability/prometheus.hpp writes the format).
#include <algorithm>
#include <string>

#include "core/gateway/server.hpp"
#include "core/observability/process_metrics.hpp"
#include "core/observability/prometheus.hpp"
#include "core/routing/conversation.hpp"

namespace pdgate {

std::string Gateway::metrics_text(bool addresses) const {
  PrometheusText m;
  m.counter("pdgate_requests_total",
            "Client requests answered, by route, status and the stage that decided it.");
  for (const auto& [key, n] : metrics_.requests()) {
    const auto& [route, status, stage] = key;
    m.sample("pdgate_requests_total",
             {{"route", route}, {"status", std::to_string(status)}, {"stage", stage}}, n);
  }
  m.histogram("pdgate_request_duration_seconds",
              "Time from a completion request read to its response's end.",
              metrics_.request_seconds);
  m.histogram_family("pdgate_time_to_first_token_seconds",
                     "Time from a completion request read to decode's first token: its first SSE "
                     "data event for a stream, its whole answer otherwise.");
  m.histogram_series("pdgate_time_to_first_token_seconds", {{"stream", "true"}},
                     metrics_.first_token_stream);
  m.histogram_series("pdgate_time_to_first_token_seconds", {{"stream", "false"}},
                     metrics_.first_token_whole);
  m.histogram("pdgate_gateway_overhead_seconds",
              "Time before decode not spent in prefill (parsing, routing, conversation store).",
              metrics_.overhead_seconds);
  m.histogram("pdgate_kv_handoff_seconds",
              "Time from prefill's answer to decode's leg sent (sequential legs).",
              metrics_.kv_handoff_seconds);
  m.counter("pdgate_kv_lease_expired_total",
            "Decode legs not sent because prefill's KV lease (--kv-lease) had run out; "
            "prefill was run again.");
  m.sample("pdgate_kv_lease_expired_total", metrics_.kv_lease_expired.load());
  m.gauge("pdgate_in_flight_requests", "Client requests being served.");
  m.sample("pdgate_in_flight_requests", active_requests_.load());
  m.counter("pdgate_retries_total", "Failovers before the first byte, by stage.");
  m.sample("pdgate_retries_total", {{"stage", "prefill"}}, metrics_.retries_prefill.load());
  m.sample("pdgate_retries_total", {{"stage", "decode"}}, metrics_.retries_decode.load());
  m.counter("pdgate_decode_migrations_total",
            "Streams whose decode broke off mid-answer, by reason (reset, error_event, stall, "
            "drain) and outcome (resumed on another decode, failed, refused).");
  {
    static constexpr const char* kReasons[] = {"reset", "error_event", "stall", "drain"};
    static constexpr const char* kOutcomes[] = {"resumed", "failed", "refused"};
    for (std::size_t r = 0; r < GatewayMetrics::kMigrationReasons; ++r) {
      for (std::size_t o = 0; o < GatewayMetrics::kMigrationOutcomes; ++o) {
        m.sample("pdgate_decode_migrations_total",
                 {{"reason", kReasons[r]}, {"outcome", kOutcomes[o]}},
                 metrics_.decode_migrations[r][o].load());
      }
    }
  }
  m.counter("pdgate_requests_by_path_total",
            "Completion requests routed, by path: pd (prefill then decode) or one_hop (decode "
            "prefills locally).");
  m.sample("pdgate_requests_by_path_total", {{"path", "pd"}}, metrics_.path_pd.load());
  m.sample("pdgate_requests_by_path_total", {{"path", "one_hop"}}, metrics_.path_one_hop.load());
  m.counter("pdgate_access_log_dropped_total",
            "Access log lines dropped because the writer could not keep up.");
  m.sample("pdgate_access_log_dropped_total", access_log_ ? access_log_->dropped() : 0);
  m.counter("pdgate_retries_refused_total", "Retries not made because the retry budget was spent.");
  m.sample("pdgate_retries_refused_total", metrics_.retries_refused.load());
  m.counter("pdgate_pick_rechecks_total",
            "Prefill picks made again after waiting for the replicas ahead, because the policy "
            "answered pdgate.RECHECK (answered at once when nothing is waited for: "
            "pdgate_policy_calls_total{outcome=\"recheck\"} counts both).");
  m.sample("pdgate_pick_rechecks_total", metrics_.pick_rechecks.load());
  m.counter("pdgate_pick_recheck_wait_seconds_total",
            "Time rechecked prefill picks waited for the replicas ahead of this one.");
  m.sample("pdgate_pick_recheck_wait_seconds_total", {},
           static_cast<double>(metrics_.pick_recheck_wait_us.load()) / 1e6);
  m.counter("pdgate_body_memory_refusals_total",
            "Request bodies refused with 503 because --body-memory-limit was reached.");
  m.sample("pdgate_body_memory_refusals_total", body_budget_.refusals());
  m.gauge("pdgate_body_memory_bytes", "Memory held by request bodies being received.");
  m.sample("pdgate_body_memory_bytes", static_cast<std::uint64_t>(body_budget_.used()));
  m.counter("pdgate_answer_memory_refusals_total",
            "Requests answered 503 because whole engine answers being read reached "
            "--answer-memory-limit.");
  m.sample("pdgate_answer_memory_refusals_total", answer_budget_.refusals());
  m.gauge("pdgate_answer_memory_bytes", "Memory held by whole engine answers being read.");
  m.sample("pdgate_answer_memory_bytes", static_cast<std::uint64_t>(answer_budget_.used()));
  m.gauge("pdgate_client_connections", "Client connections open (--max-connections bounds them).");
  m.sample("pdgate_client_connections",
           static_cast<std::uint64_t>(std::max<std::int64_t>(0, open_connections_.load())));
  m.counter("pdgate_connection_limit_reached_total",
            "Times a worker's listener stopped accepting because --max-connections was reached.");
  m.sample("pdgate_connection_limit_reached_total", metrics_.connection_bound_reached.load());
  m.counter("pdgate_ejections_total", "Instances ejected after consecutive request failures.");
  m.sample("pdgate_ejections_total", metrics_.ejections.load());
  // Zero without --tls-cert, so dashboards need no special case.
  m.counter("pdgate_tls_handshake_failures_total",
            "Client connections whose TLS handshake failed or timed out.");
  m.sample("pdgate_tls_handshake_failures_total", metrics_.tls_handshake_failures.load());
  if (listener_tls_) {
    // The certificate in force (a SIGHUP reload replaces it): alert on
    // pdgate_tls_certificate_expiry_timestamp_seconds - time() < 14 * 86400.
    if (auto ctx = listener_tls_->current()) {
      if (auto not_after = certificate_not_after(*ctx)) {
        m.gauge("pdgate_tls_certificate_expiry_timestamp_seconds",
                "When the certificate the client port presents expires (its notAfter), in "
                "seconds since the epoch.");
        m.sample("pdgate_tls_certificate_expiry_timestamp_seconds", *not_after);
      }
    }
  }
  m.counter("pdgate_shared_instances_refused_total",
            "Instances in the shared registry this replica refused (allow-list, model, loop).");
  m.sample("pdgate_shared_instances_refused_total", registry_.shared_refused_total());
  m.counter("pdgate_shared_registry_document_errors_total",
            "Times the shared registry's document could not be read or used whole (too large, "
            "not read in time, too many entries).");
  m.sample("pdgate_shared_registry_document_errors_total",
           registry_.shared_document_errors_total());

  const auto set = registry_.snapshot();
  const auto all = set->all();
  // The url label is left empty (no label, to Prometheus) for readers who
  // may not see engine addresses; the id still tells instances apart.
  struct InstanceLabels {
    std::string id;
    std::string_view url;
    const Instance* i;
  };
  // Series per instance are bounded, whatever the registry holds (a
  // shared document of 10,000 dead entries once made this page 84 MB):
  // the first kMaxInstanceSeries instances by id (those of the flags and
  // file first) have them, the count of the others is a gauge of its own.
  constexpr std::size_t kMaxInstanceSeries = 512;
  std::vector<InstanceLabels> each;
  each.reserve(std::min(all.size(), kMaxInstanceSeries));
  for (const auto& i : all) {
    if (each.size() == kMaxInstanceSeries)
      break;
    each.push_back(
        {std::to_string(i->id), addresses ? std::string_view(i->spec.url) : "", i.get()});
  }
  m.gauge("pdgate_instance_series_omitted",
          "Instances past the first 512 by id, which have no per-instance series here.");
  m.sample("pdgate_instance_series_omitted", std::uint64_t{all.size() - each.size()});
  // Latency and token series of an instance never sent a request would
  // be all zeros: it has them once it serves.
  const auto served = [](const Instance& i) { return i.requests_total.load() > 0; };
  auto per_instance = [&](std::string_view name, auto value) {
    for (const auto& [id, url, i] : each) {
      m.sample(name, {{"id", id}, {"url", url}, {"role", to_string(i->spec.role)}}, value(*i));
    }
  };
  m.gauge("pdgate_instance_in_flight", "Requests this gateway has in flight on each instance.");
  per_instance("pdgate_instance_in_flight",
               [](const Instance& i) { return static_cast<std::int64_t>(i.in_flight.load()); });
  m.gauge("pdgate_instance_cluster_in_flight",
          "Requests every gateway replica has in flight on each instance, as shared through "
          "Redis (this one's live, the others' as of their last load report).");
  per_instance("pdgate_instance_cluster_in_flight",
               [](const Instance& i) { return i.cluster_in_flight(); });
  m.gauge("pdgate_instance_queued_tokens",
          "Prompt tokens every gateway replica's requests wait to have computed on each "
          "instance (uncached; from being sent to the first token).");
  per_instance("pdgate_instance_queued_tokens",
               [](const Instance& i) { return i.cluster_queued_tokens(); });
  m.gauge("pdgate_instance_state",
          "1 for the instance's current state (active, draining, ejected).");
  for (const auto& [id, url, i] : each) {
    for (auto st : {InstanceState::active, InstanceState::draining, InstanceState::ejected}) {
      m.sample(
          "pdgate_instance_state",
          {{"id", id}, {"url", url}, {"role", to_string(i->spec.role)}, {"state", to_string(st)}},
          std::uint64_t{i->state() == st ? 1u : 0u});
    }
  }
  m.counter("pdgate_instance_requests_total", "Stage requests sent to each instance.");
  per_instance("pdgate_instance_requests_total",
               [](const Instance& i) { return std::uint64_t{i.requests_total.load()}; });
  m.counter("pdgate_instance_failures_total", "Stage requests that failed on each instance.");
  per_instance("pdgate_instance_failures_total",
               [](const Instance& i) { return std::uint64_t{i.failures_total.load()}; });

  // Latency and tokens per instance, each family over the roles it
  // describes (a prefill has no time to first token). Removed instances
  // leave the registry, and their series with them.
  auto decodes = [](const Instance& i) {
    return i.spec.role == Role::decode || i.spec.role == Role::both;
  };
  m.histogram_family("pdgate_decode_time_to_first_token_seconds",
                     "Time from sending a decode instance its request to its first token: its "
                     "first SSE data event for a stream, its whole answer otherwise.");
  for (const auto& [id, url, i] : each) {
    if (!decodes(*i) || !served(*i))
      continue;
    const std::string_view role = to_string(i->spec.role);
    m.histogram_series("pdgate_decode_time_to_first_token_seconds",
                       {{"id", id}, {"url", url}, {"role", role}, {"stream", "true"}},
                       i->latency.ttft_stream);
    m.histogram_series("pdgate_decode_time_to_first_token_seconds",
                       {{"id", id}, {"url", url}, {"role", role}, {"stream", "false"}},
                       i->latency.ttft_whole);
  }
  m.histogram_family("pdgate_inter_token_latency_seconds",
                     "Time between successive SSE data events of a decode instance's streams "
                     "(events that arrive together count as 0 after the first).");
  for (const auto& [id, url, i] : each) {
    if (decodes(*i) && served(*i)) {
      m.histogram_series("pdgate_inter_token_latency_seconds",
                         {{"id", id}, {"url", url}, {"role", to_string(i->spec.role)}},
                         i->latency.inter_token);
    }
  }
  m.histogram_family("pdgate_prefill_duration_seconds",
                     "Time of successful prefill requests, sent to answered, per instance.");
  for (const auto& [id, url, i] : each) {
    if (i->spec.role == Role::prefill && served(*i)) {
      m.histogram_series("pdgate_prefill_duration_seconds",
                         {{"id", id}, {"url", url}, {"role", "prefill"}}, i->latency.prefill);
    }
  }
  for (const auto& [name, help, prompt] :
       {std::tuple{"pdgate_prompt_tokens_total",
                   "Prompt tokens decode instances reported in their answers' usage.", true},
        std::tuple{"pdgate_completion_tokens_total",
                   "Completion tokens decode instances reported in their answers' usage.",
                   false}}) {
    m.counter(name, help);
    for (const auto& [id, url, i] : each) {
      if (decodes(*i) && served(*i)) {
        const auto& l = i->latency;
        m.sample(name, {{"id", id}, {"url", url}, {"role", to_string(i->spec.role)}},
                 (prompt ? l.prompt_tokens : l.completion_tokens).load());
      }
    }
  }
  write_build_info(m);
  write_process_metrics(m);
  if (conversations_) {
    const auto& c = conversations_->counters();
    m.counter("pdgate_conversation_cache_hits_total",
              "Turns that found the previous turn's blocks.");
    m.sample("pdgate_conversation_cache_hits_total", std::uint64_t{c.hits.load()});
    m.counter("pdgate_conversation_cache_misses_total",
              "Turns that reused nothing: none stored, another history, no client identity.");
    for (const auto& [reason, n] :
         {std::pair{"none", &c.misses_none}, std::pair{"history", &c.misses_history},
          std::pair{"scope", &c.misses_scope}}) {
      m.sample("pdgate_conversation_cache_misses_total", {{"reason", reason}},
               std::uint64_t{n->load()});
    }
    m.counter("pdgate_conversation_turns_without_params_total",
              "Conversation turns whose decode answered without kv_transfer_params (nothing "
              "for the next turn to reuse).");
    m.sample("pdgate_conversation_turns_without_params_total",
             std::uint64_t{c.turns_without_params.load()});
    m.counter("pdgate_conversation_cache_errors_total", "Conversation store failures.");
    m.sample("pdgate_conversation_cache_errors_total", std::uint64_t{c.errors.load()});
  }
  // Zero without --otlp-endpoint, so dashboards need no special case.
  const SpanStats spans = span_sink_ ? span_sink_->stats() : SpanStats{};
  m.counter("pdgate_trace_spans_exported_total",
            "Spans the OTLP receiver accepted (--otlp-endpoint).");
  m.sample("pdgate_trace_spans_exported_total", spans.exported);
  m.counter("pdgate_trace_spans_dropped_total",
            "Spans lost: the export queue was full, or the receiver failed or timed out.");
  m.sample("pdgate_trace_spans_dropped_total", {{"reason", "queue_full"}},
           spans.dropped_queue_full);
  m.sample("pdgate_trace_spans_dropped_total", {{"reason", "export_failed"}},
           spans.dropped_export_failed);
  if (rate_limits_)
    rate_limits_->write_metrics(m);
  if (client_keys_) {
    const auto& c = client_keys_->counters();
    m.counter("pdgate_client_key_requests_total",
              "Requests checked against API keys, by outcome (admitted, unauthenticated, "
              "limited_rate, limited_concurrency, limited_tokens, limiter_unavailable).");
    for (const auto& [outcome, n] :
         {std::pair{"admitted", &c.admitted}, std::pair{"unauthenticated", &c.unauthenticated},
          std::pair{"limited_rate", &c.limited_rate},
          std::pair{"limited_concurrency", &c.limited_concurrency},
          std::pair{"limited_tokens", &c.limited_tokens},
          std::pair{"limiter_unavailable", &c.limiter_unavailable}}) {
      m.sample("pdgate_client_key_requests_total", {{"outcome", outcome}},
               std::uint64_t{n->load()});
    }
    // Per key, by its name (bounded: ClientKeys::kMaxKeySeries, then
    // "other"). Every outcome is written once a key was seen, so a rate of
    // 429s reads 0 rather than nothing.
    m.counter("pdgate_key_requests_total",
              "Requests per API key (its name), by outcome: admitted, limited_rate, "
              "limited_concurrency, limited_tokens (answered 429), limiter_unavailable.");
    client_keys_->for_each_key_stats([&m](const std::string& name, const KeyStats& k) {
      for (const auto& [outcome, n] :
           {std::pair{"admitted", &k.admitted}, std::pair{"limited_rate", &k.limited_rate},
            std::pair{"limited_concurrency", &k.limited_concurrency},
            std::pair{"limited_tokens", &k.limited_tokens},
            std::pair{"limiter_unavailable", &k.limiter_unavailable}}) {
        m.sample("pdgate_key_requests_total", {{"key", name}, {"outcome", outcome}},
                 std::uint64_t{n->load()});
      }
    });
    m.counter("pdgate_key_tokens_total",
              "Prompt and completion tokens per API key (its name), as the engines counted "
              "them.");
    client_keys_->for_each_key_stats([&m](const std::string& name, const KeyStats& k) {
      m.sample("pdgate_key_tokens_total", {{"key", name}}, std::uint64_t{k.tokens.load()});
    });
    m.gauge("pdgate_client_keys", "API keys known (file and Redis).");
    m.sample("pdgate_client_keys", std::uint64_t{client_keys_->size()});
  }
  if (policy_metrics_)
    policy_metrics_(m);
  return m.take();
}

}  // namespace pdgate
