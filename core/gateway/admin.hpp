// The admin API (docs/admin.md): list, add, drain and remove instances,
// reload the policy, show the effective config. Served on its own
// listener (--admin-port); the vLLM demo proxy's POST /instances/add is
// also answered on the client port. Every change publishes a new
// InstanceSet in the Registry.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http.hpp>

#include "core/base/result.hpp"
#include "core/config/config.hpp"
#include "core/net/loop_guard.hpp"
#include "core/net/tls_context.hpp"
#include "core/upstream/instance.hpp"
#include "core/upstream/upstream_validator.hpp"

namespace pdgate {

// Equal-length-independent, data-independent comparison of secrets.
bool constant_time_equals(std::string_view a, std::string_view b);

class AdminApi : public std::enable_shared_from_this<AdminApi> {
 public:
  using Request = boost::beast::http::request<boost::beast::http::string_body>;
  using Response = boost::beast::http::response<boost::beast::http::string_body>;

  struct Hooks {
    std::function<Result<bool>()> reload_policy;  // null: no policy engine
    std::function<std::string()> metrics_text;    // GET /metrics
    std::function<std::string()> status_json;     // GET /status
    // GET /readyz, as the client port answers it: status and body.
    std::function<std::pair<unsigned, std::string>()> readiness;
    // GET /admin/policy/kv?prefix=P&limit=N: the policies' shared store
    // (JSON text), its first N keys with that prefix. Null: no policies.
    std::function<std::string(const std::string& prefix, std::size_t limit)> policy_kv;
    // GET /admin/config's "policies": versions, files, the last rejected
    // reload (JSON text). Null: no policies.
    std::function<std::string()> policy_status;
    // POST /admin/policy/explain: the status (200, 400) and JSON text of
    // what the policies would do with the request the body describes
    // (core/pipeline/policy_explain.hpp), awaited on the admin loop (a
    // declared rate limit is read from Redis). Null: no policies.
    std::function<boost::asio::awaitable<std::pair<unsigned, std::string>>(std::string document)>
        policy_explain;
    // A drain's deadline passed (POST .../drain?deadline=): the streams
    // still relaying from the instance are resumed elsewhere. Null: none.
    std::function<void(std::uint64_t instance_id)> migrate_streams;
  };

  // Reads the key (ADMIN_API_KEY, else --admin-key-file) and parses
  // --allowed-upstreams; fails with a message naming the bad one.
  // `engine_tls` reaches instances added at https:// URLs.
  static Result<std::shared_ptr<AdminApi>> create(
      const Config& cfg, Registry& registry, const LoopGuard& loop_guard,
      std::shared_ptr<const EngineTls> engine_tls = nullptr);

  // For operator routes served elsewhere (the client port's /status and
  // profiler routes): the key is required when one is configured; without
  // one they stay open, as vLLM's proxies have them. nullopt: may proceed.
  std::optional<Response> authorize_operator(const Request& req) const;
  // Whether an admin key is configured.
  bool has_key() const { return !key_.empty(); }

  void set_hooks(Hooks h) { hooks_ = std::move(h); }
  // The configuration GET /admin/config shows after a reload, and the keys
  // the reloaded file changed that wait for a restart; called on the admin
  // thread, as every request is served.
  void set_config(std::shared_ptr<const Config> live, std::vector<std::string> restart_needed) {
    live_ = std::move(live);
    restart_needed_ = std::move(restart_needed);
    ++reloads_applied_;
    last_reload_error_.clear();
  }
  // A reload was refused (`why`: every error); the configuration stays.
  void reload_refused(std::string why) {
    ++reloads_refused_;
    last_reload_error_ = std::move(why);
  }

  // Admin listener requests.
  boost::asio::awaitable<Response> handle(Request& req);
  // The demo proxy's POST /instances/add (client port).
  boost::asio::awaitable<Response> handle_demo_add(Request& req);

 private:
  // The instance /admin/instances/{segment} names: its id, or its URL
  // (percent-encoded, or host:port) with ?role= in `target` when the URL
  // serves in two roles; else why not (404, 409, 400).
  std::variant<std::uint64_t, GatewayError> instance_id_of(std::string_view segment,
                                                           std::string_view target) const;
  AdminApi(const Config& cfg, Registry& registry, std::string key, UpstreamValidator validator)
      : cfg_(cfg),
        live_(std::make_shared<const Config>(cfg)),
        registry_(registry),
        key_(std::move(key)),
        validator_(std::move(validator)) {}

  // nullopt when the request may proceed.
  std::optional<Response> authorize(const Request& req, bool mutating) const;
  // A drain's deadline: `?deadline=2s` or a body {"deadline_ms": 2000};
  // none when neither is given.
  static Result<std::optional<std::chrono::milliseconds>> drain_deadline(const Request& req);
  // Once `deadline` passed, the instance's streams are resumed elsewhere
  // if it is still draining (Hooks::migrate_streams).
  void migrate_at_deadline(boost::asio::any_io_executor ex, std::uint64_t id,
                           std::chrono::milliseconds deadline);
  static constexpr std::chrono::hours kMaxDrainDeadline{24};
  // Deadline timers running at most: more drains with one are refused.
  static constexpr std::size_t kMaxPendingDeadlines = 1024;
  std::size_t pending_deadlines_ = 0;
  boost::asio::awaitable<Response> add(const Request& req, Role role, const std::string& url,
                                       std::map<std::string, std::string> labels, unsigned weight,
                                       KvEventsEndpoint kv_events, std::uint32_t dp_size = 1);

  const Config& cfg_;  // as started: what needs a restart to change
  std::shared_ptr<const Config> live_;
  std::vector<std::string> restart_needed_;
  std::uint64_t reloads_applied_ = 0;
  std::uint64_t reloads_refused_ = 0;
  std::string last_reload_error_;  // empty unless the last reload was refused
  Registry& registry_;
  const std::string key_;
  const UpstreamValidator validator_;
  Hooks hooks_;
};

// The admin listener (--admin-port): accepts on `acceptor` and serves each
// connection with `api` (keep-alive, small bodies, `idle_timeout` between
// requests) until the acceptor is closed. Runs on the acceptor's executor,
// the gateway's control loop, never on a worker. With `tls` (which must
// outlive the listener) each connection is TLS with its current context,
// the handshake bounded by `idle_timeout`.
boost::asio::awaitable<void> serve_admin(boost::asio::ip::tcp::acceptor& acceptor,
                                         std::shared_ptr<AdminApi> api, const ListenerTls* tls,
                                         std::chrono::milliseconds idle_timeout);

}  // namespace pdgate
