// Everything one worker thread's requests share. Each worker runs its own
// io_context on one thread, so nothing here needs a lock; what is shared
// across workers (registry, picker) is read-only or atomic, and `cfg` is
// the worker's own copy, which a reload replaces on this thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.hpp"
#include "core/net/client_watch.hpp"
#include "core/net/loop_guard.hpp"
#include "core/observability/metrics.hpp"
#include "core/observability/request_ids.hpp"
#include "core/observability/trace_context.hpp"
#include "core/pipeline/call_slots.hpp"
#include "core/pipeline/client_keys.hpp"
#include "core/pipeline/rate_limit_phase.hpp"
#include "core/routing/conversation_store.hpp"
#include "core/routing/kv_connector.hpp"
#include "core/upstream/instance.hpp"
#include "core/upstream/mooncake_bootstrap.hpp"
#include "core/upstream/upstream.hpp"

namespace pdgate {

class SpanSink;
struct StreamResume;

struct WorkerContext {
  WorkerContext(const Config& c, Registry& r, std::unique_ptr<InstancePicker> p,
                net::any_io_executor ex, std::string default_auth,
                std::atomic<std::int64_t>& active)
      : cfg(c),
        registry(r),
        picker_owner(std::move(p)),
        picker(*picker_owner),
        pools(ex, c.upstream_max_idle, c.upstream_idle_timeout),
        client_watches(ex),
        encoder_slots(c.encode_max_inflight),
        default_authorization(std::move(default_auth)),
        active_requests(active) {}

  // Read at each use: a reload (SIGHUP) may change it between two events.
  const Config& cfg;
  Registry& registry;
  std::unique_ptr<InstancePicker> picker_owner;
  InstancePicker& picker;
  UpstreamPools pools;
  // Requests whose client is not watched yet (core/net/client_watch.hpp).
  ClientWatches client_watches;
  // Encoder calls this worker makes at once, for all its requests
  // (--encode-max-inflight).
  CallSlots encoder_slots;
  // Request ids (core/observability/request_ids.hpp).
  RequestIds request_ids;
  // "Bearer $OPENAI_API_KEY" when the variable was set at start-up and the
  // client sent no Authorization of its own.
  const std::string default_authorization;
  std::atomic<std::int64_t>& active_requests;
  // Requests this worker has begun: its housekeeping tells a worker that
  // went quiet by it.
  std::uint64_t requests_started = 0;
  // The last PickContext::serial given to a request of this worker.
  std::uint64_t last_request_serial = 0;
  // Multi-turn KV reuse: this worker's handle on the conversation store
  // (null: reuse off, e.g. in tests that build a bare WorkerContext).
  std::unique_ptr<ConversationStore> conversations;
  ConversationStores* conversation_stores = nullptr;
  // How prefill hands the KV cache to decode (--kv-connector), chosen by
  // the composition root; shared by every worker (connectors are const).
  const KvConnector* connector = nullptr;
  // Mooncake's bootstrap-server answers, per prefill instance.
  MooncakeBootstrap mooncake;
  // Shared by all workers; null in tests that build a bare WorkerContext.
  GatewayMetrics* metrics = nullptr;
  // API keys and their limits (--api-keys); null: no key is asked for.
  ClientKeys* client_keys = nullptr;
  std::unique_ptr<ClientLimiter> client_limiter;
  // The request hook's declared limits (core/pipeline/rate_limit_phase.hpp):
  // this worker's handle; null: declared limits are not checked (tests
  // that build a bare WorkerContext).
  std::unique_ptr<RateLimiter> rate_limiter;
  // This gateway's Via identity (null: no Via is sent).
  const LoopGuard* loop_guard = nullptr;
  // Where finished spans go (null: tracing off), and this worker's ids.
  SpanSink* spans = nullptr;
  TraceIdSource trace_ids;
  // The streams this worker relays that may be resumed elsewhere
  // (core/pipeline/relay.hpp): a drain's deadline moves those on its
  // instance (migrate_streams()). Each knows its slot, so leaving is O(1).
  std::vector<StreamResume*> resumable_streams;

  UpstreamTimeouts timeouts() const { return {cfg.connect_timeout, cfg.first_byte_timeout}; }
};

}  // namespace pdgate
