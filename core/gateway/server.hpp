// The gateway process: worker threads, each with its own io_context and
// its own listening socket on the shared port (SO_REUSEPORT lets the kernel
// spread connections), the admin thread (admin listener, health checks,
// shared registry), the routes and the state they share. Signals are the
// control loop's (core/gateway/control_loop.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <nlohmann/json.hpp>

#include "core/config/config.hpp"
#include "core/gateway/access_log.hpp"
#include "core/gateway/admin.hpp"
#include "core/gateway/client_session.hpp"
#include "core/gateway/routes.hpp"
#include "core/net/body_budget.hpp"
#include "core/net/loop_guard.hpp"
#include "core/net/tls_context.hpp"
#include "core/observability/metrics.hpp"
#include "core/observability/prometheus.hpp"
#include "core/observability/tracing.hpp"
#include "core/pipeline/client_keys.hpp"
#include "core/pipeline/worker.hpp"
#include "core/upstream/instance.hpp"
#include "core/upstream/registry_sync.hpp"

namespace pdgate {

class Gateway {
 public:
  // `make_picker` builds each worker's instance picker (default:
  // round-robin); `make_registry_sync` what shares the instance registry
  // with other replicas (default: nothing is shared); `ids` the cluster's
  // ids of the configured engines, asked before the registry is made
  // (plugins/shared_registry.hpp, SharedRegistry::config_ids).
  Gateway(Config cfg, std::unique_ptr<ConversationStores> conversations,
          std::shared_ptr<const KvConnector> connector,
          PickerFactory make_picker = RoundRobinPicker::factory(),
          RegistrySyncFactory make_registry_sync = {}, const ClusterIds& ids = {});
  ~Gateway();

  const Registry& registry() const { return registry_; }
  Registry& registry() { return registry_; }
  // This process's Via identity, for what validates instances outside the
  // gateway (dns:// discovery).
  const LoopGuard& loop_guard() const { return loop_guard_; }

  // How https:// engines are reached (core/net/tls_context.hpp), from main();
  // set before bind().
  void set_engine_tls(std::shared_ptr<const EngineTls> tls);
  // Binds the listeners (client, and admin when --admin-port is given);
  // returns an error message if a port is taken, the TLS certificate or
  // key cannot be loaded, or the admin key or allow-list is unusable.
  Result<std::uint16_t> bind();
  // Whether the client listener speaks TLS (--tls-cert).
  bool tls() const { return listener_tls_ != nullptr; }
  // Whether the admin listener speaks TLS (--admin-tls-cert).
  bool admin_tls() const { return admin_tls_ != nullptr; }
  // SIGHUP: loads the listener's certificate and key again. On success,
  // the returned action makes new handshakes use them (connections already
  // established keep theirs); a pair that does not load is an error and
  // the running one stays. Nothing to do without --tls-cert.
  Result<std::function<void()>> prepare_tls_reload() const;
  std::uint16_t admin_port() const { return admin_port_; }
  // Policy reload for the admin API, and extra /metrics text (policy
  // counters), both from main(); set before run().
  void set_policy_hooks(std::function<Result<bool>()> reload,
                        std::function<void(PrometheusText&)> metrics);
  // GET /admin/policy/kv's listing of the policies' shared store (JSON
  // text); from main(), set before run().
  void set_policy_kv(std::function<std::string(const std::string&, std::size_t)> listing) {
    policy_kv_ = std::move(listing);
  }
  // POST /admin/policy/explain's picker (PolicyEngine::make_dry_picker):
  // made for each call on the admin thread. From main(), before run().
  using DryPickerFactory =
      std::function<Result<std::unique_ptr<InstancePicker>>(const InstanceSet& set)>;
  void set_policy_explainer(DryPickerFactory make) { make_dry_picker_ = std::move(make); }
  // GET /admin/config's "policies" (JSON text); from main(), before run().
  void set_policy_status(std::function<std::string()> status) {
    policy_status_ = std::move(status);
  }
  // What hands the memory a worker's allocator holds freed back to the
  // system, called by each worker on its own thread (the allocator keeps a
  // heap per thread) once it has gone quiet: a second without a new
  // request, after some. From main(), set before start(). A burst of
  // requests leaves freed pages behind that an allocator returns only on
  // its next frees: a worker that then holds 10,000 idle streams makes none.
  void set_allocator_trim(std::function<void()> trim);
  // Where the workers hand finished spans (docs/tracing.md); set before
  // start(). Without one, no spans are made.
  void set_span_sink(std::shared_ptr<SpanSink> sink);
  // API keys and limits (--api-keys); their background work (keys
  // refreshed from Redis) runs on `control`. Set before start().
  void set_client_keys(std::unique_ptr<ClientKeys> keys, net::any_io_executor control);
  // The limits policies declare (req:rate_limit): each worker's limiter,
  // and the admin loop's for explain's dry checks. Set before start();
  // without, declared limits are not checked.
  void set_rate_limits(std::unique_ptr<RateLimits> limits);
  // Reopens the access log file at its path (SIGUSR1).
  void reopen_logs();
  // The client keys set_client_keys() installed, or nullptr.
  ClientKeys* client_keys() const { return client_keys_.get(); }
  // Prometheus text for GET /metrics.
  // `addresses`: whether instances' url labels are filled in.
  std::string metrics_text(bool addresses) const;
  // Applies a reloaded configuration (core/gateway/config_reload.hpp): the
  // instance lists are reconciled with the registry at once, and each
  // worker, and the admin API, swaps in `next` on its own thread before
  // its next event, so a request reads its settings without a lock and
  // never sees a half-written one. Settings that need a restart must
  // already be `before`'s (reloadable_part). Call from one thread.
  // `restart_needed`: keys the file changed that keep their running value,
  // for GET /admin/config. `ids`: the cluster's ids of the engines `next`
  // adds (cluster_ids_for).
  void apply_config(const Config& before, std::shared_ptr<const Config> next,
                    std::vector<std::string> restart_needed, const ClusterIds& ids = {});
  // A reload was refused: GET /admin/config says why.
  void reload_refused(std::string why);
  // Starts the workers and the admin thread; returns at once.
  void start();
  // Stops accepting (the listeners close); in-flight requests go on.
  void begin_drain();
  std::int64_t in_flight() const { return active_requests_.load(); }
  // Stops the workers' loops, whatever is still in flight.
  void stop();
  // Returns once every thread has ended (after stop()).
  void wait();

 private:
  struct Worker;
  net::awaitable<void> accept_loop(Worker& worker);
  // Fills routes_: every route of the client port.
  void build_routes();
  net::awaitable<bool> demo_add(ClientRequest& c);
  // GET /status; `addresses` adds the engines' URLs.
  nlohmann::json status_document(bool addresses) const;

  Config cfg_;
  Registry registry_;
  PickerFactory make_picker_;
  RegistrySyncFactory make_registry_sync_;
  // Before workers_: the workers' store handles refer to it.
  std::unique_ptr<ConversationStores> conversations_;
  std::shared_ptr<const KvConnector> connector_;
  std::atomic<std::int64_t> active_requests_{0};
  std::atomic<bool> stopping_{false};
  GatewayMetrics metrics_;
  BodyBudget body_budget_{cfg_.body_memory_limit};
  // Whole engine answers being read (--answer-memory-limit): the same kind
  // of budget, charged by the workers' upstream exchanges.
  BodyBudget answer_budget_{cfg_.answer_memory_limit};
  // Client connections open, all workers together (--max-connections).
  std::atomic<std::int64_t> open_connections_{0};
  // This process's Via identity (routing-loop detection).
  const LoopGuard loop_guard_;
  std::function<Result<bool>()> reload_policy_;
  std::function<void(PrometheusText&)> policy_metrics_;
  std::function<std::string(const std::string&, std::size_t)> policy_kv_;
  std::function<std::string()> policy_status_;
  DryPickerFactory make_dry_picker_;
  // The admin API's POST /admin/policy/explain; null without policies.
  std::function<net::awaitable<std::pair<unsigned, std::string>>(std::string)> explain_hook();
  net::awaitable<std::pair<unsigned, std::string>> explain(std::string document);
  std::shared_ptr<SpanSink> span_sink_;
  std::function<void()> trim_allocator_;
  std::shared_ptr<AdminApi> admin_;
  // Before admin_ioc_ and workers_: the limiters' Redis connections, whose
  // handlers those loops may hold until they are destroyed, refer to it.
  std::unique_ptr<RateLimits> rate_limits_;
  // The admin listener and the health checks run on their own thread, so
  // neither competes with client traffic on a worker's loop.
  net::io_context admin_ioc_{1};
  // Explain's dry checks of declared limits, on the admin loop.
  std::unique_ptr<RateLimiter> admin_rate_limiter_;
  std::optional<tcp::acceptor> admin_acceptor_;
  std::uint16_t admin_port_ = 0;
  std::thread admin_thread_;
  // With --redis: the instance set shared with the other replicas.
  std::unique_ptr<RegistrySync> shared_registry_;
  // Before workers_: their limiters refer to it.
  std::unique_ptr<ClientKeys> client_keys_;
  // Before workers_: their connections refer to them.
  RouteTable routes_;
  // Opened by bind() when --access-log is on; outlives the workers (it
  // drains its queue when destroyed).
  std::unique_ptr<AccessLog> access_log_;
  // Made by bind() with --tls-cert; swapped by a reload.
  std::unique_ptr<ListenerTls> listener_tls_;
  // Made by bind() with --admin-tls-cert; swapped by a reload.
  std::unique_ptr<ListenerTls> admin_tls_;
  std::shared_ptr<const EngineTls> engine_tls_;
  const ClientSessionEnv session_env_{routes_,          body_budget_, loop_guard_, metrics_,
                                      active_requests_, stopping_,    access_log_, listener_tls_};
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace pdgate
