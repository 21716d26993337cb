#include "core/gateway/admin.hpp"

#include "core/base/url.hpp"
#include "core/routing/kv_events.hpp"

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <nlohmann/json.hpp>

#include "core/base/text.hpp"
#include "core/base/use_tuple.hpp"
#include "core/config/detail/values.hpp"
#include "core/net/errors.hpp"
#include "core/net/http_head.hpp"
#include "core/net/maybe_tls_stream.hpp"
#include "core/net/response_writer.hpp"
#include "core/net/tls_context.hpp"
#include "core/upstream/instance_address.hpp"

namespace pdgate {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;
using tcp = net::ip::tcp;

namespace {

// GET /admin/policy/kv lists this many keys unless asked for fewer (or
// more, up to the cap): the store holds up to ~16,000 small entries.
constexpr std::size_t kPolicyKvDefaultLimit = 100;
constexpr std::size_t kPolicyKvMaxLimit = 1000;

AdminApi::Response json_response(const AdminApi::Request& req, unsigned status, const json& j) {
  AdminApi::Response res{static_cast<http::status>(status), req.version()};
  res.set(http::field::server, "pdgate");
  res.set(http::field::content_type, "application/json");
  res.keep_alive(req.keep_alive());
  res.body() = j.dump(-1, ' ', false, json::error_handler_t::replace);
  res.prepare_payload();
  return res;
}

AdminApi::Response error(const AdminApi::Request& req, unsigned status, const std::string& msg) {
  return make_error_response(status, msg, req.version(), req.keep_alive());
}

json instance_json(const Instance& i) {
  auto history = json::array();
  for (const auto& h : i.history()) {
    history.push_back({{"at_ms", h.at_ms}, {"ok", h.ok}, {"what", h.what}});
  }
  return {{"id", i.id},
          {"url", i.spec.url},
          {"role", to_string(i.spec.role)},
          {"labels", *i.labels()},
          {"weight", i.weight()},
          // A data-parallel engine is listed rank by rank (ids consecutive).
          {"data_parallel_rank", i.spec.dp_rank ? json(*i.spec.dp_rank) : json(nullptr)},
          {"data_parallel_size", i.spec.dp_size},
          {"kv_events", i.spec.kv_events.endpoint.empty()
                            ? json(nullptr)
                            : json{{"endpoint", i.spec.kv_events.endpoint},
                                   {"replay_endpoint", i.spec.kv_events.replay}}},
          {"state", to_string(i.state())},
          {"healthy", i.healthy.load()},
          {"in_flight", i.in_flight.load()},
          // What routing sees (core/upstream/load_model.hpp): every
          // replica's requests and queued prompt tokens, the learnt cost.
          {"load",
           {{"cluster_in_flight", i.cluster_in_flight()},
            {"queued_tokens", i.cluster_queued_tokens()},
            {"engine_other_load", i.engine_other_load.load()},
            {"prefill_ms_per_token", i.prefill_ms_per_token.load()}}},
          {"requests_total", i.requests_total.load()},
          {"failures_total", i.failures_total.load()},
          {"consecutive_failures", i.consecutive_failures.load()},
          {"ejections", i.ejections.load()},
          {"health_history", history}};
}

// The optional "labels" member of an add or a PATCH: an object of
// strings.
Result<std::optional<Instance::Labels>> labels_field(const json& j) {
  const auto it = j.find("labels");
  if (it == j.end())
    return std::optional<Instance::Labels>();
  if (!it->is_object())
    return fail("labels must be an object");
  if (it->size() > LabelLimits::kMaxCount)
    return fail("labels: at most " + std::to_string(LabelLimits::kMaxCount) + " per instance");
  Instance::Labels labels;
  for (const auto& [k, v] : it->items()) {
    if (!v.is_string())
      return fail("label values must be strings");
    labels[k] = v.get<std::string>();
  }
  if (auto why = label_problem(labels))
    return fail("labels: " + *why);
  return std::optional<Instance::Labels>(std::move(labels));
}

// The optional "weight" member: an integer from 1 to 1000.
Result<std::optional<unsigned>> weight_field(const json& j) {
  const auto it = j.find("weight");
  if (it == j.end())
    return std::optional<unsigned>();
  if (!it->is_number_unsigned() || it->get<unsigned long>() < 1 ||
      it->get<unsigned long>() > 1000) {
    return fail("weight must be an integer from 1 to 1000");
  }
  return std::optional<unsigned>(it->get<unsigned>());
}

// The optional "kv_events" of an add: {"endpoint": "tcp://host:port",
// "replay_endpoint": "tcp://host:port"} (docs/kv-events.md).
Result<KvEventsEndpoint> kv_events_field(const json& j) {
  const auto it = j.find("kv_events");
  if (it == j.end() || it->is_null())
    return KvEventsEndpoint{};
  if (!it->is_object() || !it->contains("endpoint") || !(*it)["endpoint"].is_string())
    return fail("kv_events must be {\"endpoint\": \"tcp://host:port\", \"replay_endpoint\": ...}");
  KvEventsEndpoint ev;
  ev.endpoint = (*it)["endpoint"].get<std::string>();
  if (const auto r = it->find("replay_endpoint"); r != it->end() && !r->is_null()) {
    if (!r->is_string())
      return fail("kv_events.replay_endpoint must be a string");
    ev.replay = r->get<std::string>();
  }
  auto checked = check_kv_events_endpoint(std::move(ev));
  if (!checked)
    return fail("kv_events: " + checked.error());
  return *checked;
}

// The optional "labels" and "weight" of an add or a PATCH.
struct MetaFields {
  std::optional<Instance::Labels> labels;
  std::optional<unsigned> weight;
};
Result<MetaFields> meta_fields(const json& j) {
  auto labels = labels_field(j);
  if (!labels)
    return fail(labels.error());
  auto weight = weight_field(j);
  if (!weight)
    return fail(weight.error());
  return MetaFields{std::move(*labels), *weight};
}

// Every option's effective value under its flag's name (as --help lists
// them), secrets masked; the instance lists with their labels and weights.
json config_json(const Config& c) {
  json out = json::object();
  for (const auto& e : effective_config(c)) {
    if (e.list)
      out[e.key] = e.values;
    else
      out[e.key] = e.values.empty() ? std::string() : e.values.front();
  }
  auto specs = [](const std::vector<UpstreamSpec>& v) {
    auto a = json::array();
    for (const auto& s : v)
      a.push_back({{"url", s.url}, {"labels", s.labels}, {"weight", s.weight}});
    return a;
  };
  out["prefill"] = specs(c.prefill);
  out["decode"] = specs(c.decode);
  out["encode"] = specs(c.encode);
  return out;
}

}  // namespace

bool constant_time_equals(std::string_view a, std::string_view b) {
  // Runs over the longer input whatever the contents, so the time taken
  // says nothing about where the first difference is.
  const std::size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

Result<std::shared_ptr<AdminApi>> AdminApi::create(const Config& cfg, Registry& registry,
                                                   const LoopGuard& loop_guard,
                                                   std::shared_ptr<const EngineTls> engine_tls) {
  std::string key;
  if (const char* env = std::getenv("ADMIN_API_KEY"); env != nullptr && *env != '\0') {
    key = env;
  } else if (!cfg.admin_key_file.empty()) {
    std::ifstream in(cfg.admin_key_file);
    if (!in)
      return fail("--admin-key-file: cannot read " + cfg.admin_key_file);
    std::stringstream ss;
    ss << in.rdbuf();
    key = std::string(trim(ss.str()));
    if (key.empty())
      return fail("--admin-key-file: " + cfg.admin_key_file + " is empty");
  }
  auto validator = UpstreamValidator::create(cfg, loop_guard, std::move(engine_tls));
  if (!validator)
    return fail(validator.error());
  return std::shared_ptr<AdminApi>(
      new AdminApi(cfg, registry, std::move(key), std::move(*validator)));
}

std::optional<AdminApi::Response> AdminApi::authorize_operator(const Request& req) const {
  if (key_.empty())
    return std::nullopt;
  return authorize(req, true);
}

std::optional<AdminApi::Response> AdminApi::authorize(const Request& req, bool mutating) const {
  if (key_.empty()) {
    if (!mutating)
      return std::nullopt;
    return error(req, 403,
                 "the admin API has no key configured: set ADMIN_API_KEY or --admin-key-file to "
                 "allow changes");
  }
  std::string given;
  if (auto it = req.find("x-api-key"); it != req.end()) {
    given = std::string(it->value());
  } else if (auto a = req.find(http::field::authorization); a != req.end()) {
    const std::string_view v = a->value();
    if (v.size() > 7 && beast::iequals(v.substr(0, 7), "Bearer "))
      given = std::string(v.substr(7));
  }
  if (given.empty()) {
    return error(req, 401, "admin API key required: send X-API-Key or Authorization: Bearer");
  }
  if (!constant_time_equals(given, key_))
    return error(req, 403, "admin API key is not valid");
  return std::nullopt;
}

net::awaitable<AdminApi::Response> AdminApi::add(const Request& req, Role role,
                                                 const std::string& url,
                                                 std::map<std::string, std::string> labels,
                                                 unsigned weight, KvEventsEndpoint kv_events,
                                                 std::uint32_t dp_size) {
  auto spec = parse_upstream(role, url);
  if (!spec)
    co_return error(req, 400, spec.error());
  spec->role = role;
  spec->kv_events = std::move(kv_events);
  spec->dp_size = dp_size;
  // Cheap duplicate check first: no network probe for a known instance.
  if (auto i = registry_.conflict(role, spec->url)) {
    co_return error(req, 409,
                    spec->url + " is already registered as " + to_string(i->spec.role) + " (id " +
                        std::to_string(i->id) + ")");
  }
  // The same engine under another name (localhost and 127.0.0.1): the
  // resolver runs on its own thread, bounded like the checks below.
  auto ex = co_await net::this_coro::executor;
  if (auto i = co_await same_address_instance(
          ex, *registry_.snapshot(), *spec,
          std::chrono::steady_clock::now() + cfg_.model_check_timeout)) {
    co_return error(req, 409,
                    spec->url + " is the same address as " + i->spec.url +
                        ", already registered as " + to_string(i->spec.role) + " (id " +
                        std::to_string(i->id) + ")");
  }
  auto invalid = co_await validator_.check(*spec);
  if (invalid)
    co_return make_error_response(*invalid, req.version(), req.keep_alive());
  // The cluster's id for it (the same on every replica), asked before it
  // is listed: an id is never renumbered.
  std::vector<NewInstance> one;
  one.push_back({std::move(*spec), std::move(labels), weight});
  co_await registry_.take_cluster_ids(one);
  auto [err, inst] = std::move(registry_.add(std::move(one)).front());
  if (err)
    co_return make_error_response(*err, req.version(), req.keep_alive());
  spdlog::info("admin: added {} instance {} (id {})", to_string(role), inst->spec.url, inst->id);
  co_return json_response(req, 201, instance_json(*inst));
}

net::awaitable<AdminApi::Response> AdminApi::handle_demo_add(Request& req) {
  if (auto denied = authorize(req, true))
    co_return *denied;
  auto j = json::parse(req.body(), nullptr, false);
  if (!j.is_object() || !j.contains("type") || !j.contains("instance") || !j["type"].is_string() ||
      !j["instance"].is_string()) {
    co_return error(req, 400,
                    "expected {\"type\": \"prefill|decode\", \"instance\": \"host:port\"}");
  }
  const std::string type = j["type"];
  if (type != "prefill" && type != "decode") {
    co_return error(req, 400, "type must be prefill or decode");
  }
  const Role role = type == "prefill" ? Role::prefill : Role::decode;
  // A named value, not `{}`: GCC 12 frees a braced aggregate temporary
  // passed to a coroutine twice (the add crashed with an invalid free).
  KvEventsEndpoint no_events;
  co_return co_await add(req, role, j["instance"].get<std::string>(), {}, 1, std::move(no_events));
}

std::variant<std::uint64_t, GatewayError> AdminApi::instance_id_of(std::string_view segment,
                                                                   std::string_view target) const {
  // An id: this replica's number for the instance.
  if (!segment.empty() && segment.find_first_not_of("0123456789") == std::string_view::npos) {
    std::uint64_t id = 0;  // past 2^64: 0, which no instance has
    std::from_chars(segment.data(), segment.data() + segment.size(), id);
    return id;
  }
  // Else its URL, the same on every replica: percent-encoded
  // (http%3A%2F%2Fhost%3A8000) or host:port as written, with ?role= when
  // the URL serves in two roles.
  auto text = percent_decoded(segment);
  if (!text || text->empty())
    return client_error(ErrorKind::not_found, "no instance " + std::string(segment));
  auto spec = parse_upstream(Role::decode, *text);
  if (!spec)
    return client_error(ErrorKind::not_found, "no instance " + *text + ": " + spec.error());
  std::optional<Role> role;
  if (const auto q = target.find('?'); q != std::string_view::npos) {
    auto items = query_items(target.substr(q + 1));
    if (!items)
      return client_error(ErrorKind::bad_request, "query: " + items.error());
    for (const auto& [k, v] : *items) {
      if (k != "role")
        continue;
      role = role_from_string(v);
      if (!role)
        return client_error(ErrorKind::bad_request, "role must be prefill, decode, encode or both");
    }
  }
  const auto set = registry_.snapshot();
  InstancePtr match;
  for (const auto& i : set->by_id) {
    if (i->spec.url != spec->url || (role && i->spec.role != *role))
      continue;
    // Another rank of a data-parallel engine: the engine is one (the
    // first rank, by id, stands for it; changes act on every rank).
    if (match && match->spec.role == i->spec.role && i->spec.dp_rank)
      continue;
    if (match) {
      return client_error(ErrorKind::conflict, spec->url +
                                                   " is registered in more than one role (" +
                                                   to_string(match->spec.role) + ", " +
                                                   to_string(i->spec.role) + "): add ?role=ROLE");
    }
    match = i;
  }
  if (!match) {
    return client_error(ErrorKind::not_found, "no " + std::string(role ? to_string(*role) : "") +
                                                  (role ? " " : "") + "instance " + spec->url);
  }
  return match->id;
}

net::awaitable<AdminApi::Response> AdminApi::handle(Request& req) {
  const std::string path(path_of(req.target()));
  const auto method = req.method();
  const bool mutating = method != http::verb::get && method != http::verb::head;
  if (path == "/metrics" && method == http::verb::get && hooks_.metrics_text) {
    // Metrics are read-only and scraped by Prometheus without a key.
    Response res{http::status::ok, req.version()};
    res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    res.body() = hooks_.metrics_text();
    res.keep_alive(req.keep_alive());
    res.prepare_payload();
    co_return res;
  }
  if (path == "/health" && method == http::verb::get) {
    co_return json_response(req, 200, {{"status", "ok"}});
  }
  // The probes, open as on the client port: the kubelet sends no key, and
  // with client certificates required there (--tls-client-ca) it cannot
  // pass on the client port at all (docs/admin.md, "Probes").
  if (path == "/livez" && method == http::verb::get)
    co_return json_response(req, 200, {{"status", "alive"}});
  if (path == "/readyz" && method == http::verb::get && hooks_.readiness) {
    auto [status, body] = hooks_.readiness();
    co_return json_response(req, status, json::parse(body, nullptr, false));
  }
  if (auto denied = authorize(req, mutating))
    co_return *denied;

  if (path == "/instances/add" && method == http::verb::post)
    co_return co_await handle_demo_add(req);
  if (path == "/status" && method == http::verb::get && hooks_.status_json) {
    co_return json_response(req, 200, json::parse(hooks_.status_json()));
  }
  if (path == "/admin/config" && method == http::verb::get) {
    auto j = config_json(*live_);
    j["restart_needed"] = restart_needed_;
    j["reloads"] = {{"applied", reloads_applied_},
                    {"refused", reloads_refused_},
                    {"last_error", last_reload_error_}};
    // The policies' own state: a script rejected by file polling shows
    // here too, not only in the log.
    if (hooks_.policy_status)
      j["policies"] = json::parse(hooks_.policy_status());
    co_return json_response(req, 200, j);
  }
  if (path == "/admin/policy/reload" && method == http::verb::post) {
    if (!hooks_.reload_policy)
      co_return error(req, 404, "no policy engine to reload");
    auto r = hooks_.reload_policy();
    if (!r)
      co_return error(req, 422, "policy reload failed: " + r.error());
    co_return json_response(req, 200, {{"reloaded", *r}});
  }
  if (path == "/admin/policy/explain" && method == http::verb::post) {
    if (!hooks_.policy_explain)
      co_return error(req, 404, "no policy engine");
    auto [status, text] = co_await hooks_.policy_explain(req.body());
    if (status != 200)
      co_return error(req, status, "policy explain: " + text);
    co_return json_response(req, 200, json::parse(text));
  }
  if (path == "/admin/policy/kv" && method == http::verb::get) {
    if (!hooks_.policy_kv)
      co_return error(req, 404, "no policy engine");
    std::string prefix;
    std::size_t limit = kPolicyKvDefaultLimit;
    const std::string_view target = req.target();
    if (const auto q = target.find('?'); q != std::string_view::npos) {
      auto items = query_items(target.substr(q + 1));
      if (!items)
        co_return error(req, 400, "query: " + items.error());
      for (const auto& [k, v] : *items) {
        if (k == "prefix") {
          prefix = v;
        } else if (k == "limit") {
          std::size_t n = 0;
          const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
          if (ec != std::errc{} || end != v.data() + v.size() || n < 1 || n > kPolicyKvMaxLimit)
            co_return error(req, 400, "limit must be 1.." + std::to_string(kPolicyKvMaxLimit));
          limit = n;
        }
      }
    }
    co_return json_response(req, 200, json::parse(hooks_.policy_kv(prefix, limit)));
  }
  if (path == "/admin/instances") {
    if (method == http::verb::get) {
      const auto set = registry_.snapshot();
      auto arr = json::array();
      for (const auto& i : set->by_id)
        arr.push_back(instance_json(*i));
      co_return json_response(req, 200,
                              {{"instances", arr},
                               {"refused_total", registry_.shared_refused_total()},
                               {"document_errors_total", registry_.shared_document_errors_total()},
                               {"last_document_error", registry_.last_shared_document_error()}});
    }
    if (method == http::verb::post) {
      auto j = json::parse(req.body(), nullptr, false);
      if (!j.is_object() || !j.contains("url") || !j["url"].is_string()) {
        co_return error(req, 400,
                        "expected {\"role\": \"prefill|decode|encode|both\", \"url\": "
                        "\"http://host:port\", \"labels\": {}, \"weight\": 1}");
      }
      const std::string role_text = j.value("role", std::string("decode"));
      auto role = role_from_string(role_text);
      if (!role)
        co_return error(req, 400, "role must be prefill, decode, encode or both");
      auto meta = meta_fields(j);
      if (!meta)
        co_return error(req, 400, meta.error());
      auto events = kv_events_field(j);
      if (!events)
        co_return error(req, 400, events.error());
      std::uint32_t dp_size = 1;
      if (auto it = j.find("data_parallel_size"); it != j.end()) {
        if (!it->is_number_unsigned() || it->get<std::uint64_t>() < 1 ||
            it->get<std::uint64_t>() > UpstreamSpec::kMaxDataParallelSize ||
            (*role != Role::prefill && *role != Role::decode && *role != Role::both)) {
          co_return error(req, 400,
                          "data_parallel_size must be an integer from 1 to " +
                              std::to_string(UpstreamSpec::kMaxDataParallelSize) +
                              ", for a prefill, decode or both instance");
        }
        dp_size = static_cast<std::uint32_t>(it->get<std::uint64_t>());
      }
      co_return co_await add(req, *role, j["url"].get<std::string>(),
                             meta->labels.value_or(Instance::Labels{}), meta->weight.value_or(1),
                             std::move(*events), dp_size);
    }
    co_return error(req, 405, "use GET or POST on /admin/instances");
  }
  // /admin/instances/{id}, /admin/instances/{id}/drain, .../undrain
  static constexpr std::string_view kPrefix = "/admin/instances/";
  if (path.starts_with(kPrefix)) {
    std::string rest = path.substr(kPrefix.size());
    bool drain_only = false;
    bool undrain = false;
    if (rest.ends_with("/drain")) {
      drain_only = true;
      rest.resize(rest.size() - 6);
    } else if (rest.ends_with("/undrain")) {
      undrain = true;
      rest.resize(rest.size() - 8);
    }
    const auto found = instance_id_of(rest, req.target());
    if (const auto* e = std::get_if<GatewayError>(&found))
      co_return make_error_response(*e, req.version(), req.keep_alive());
    const std::uint64_t id = std::get<std::uint64_t>(found);
    // The instance is the one drain() acted on: it may be forgotten (no
    // longer findable) the moment drain() returns, when it had nothing in
    // flight and was already marked for removal.
    if (drain_only && method == http::verb::post) {
      auto deadline = drain_deadline(req);
      if (!deadline)
        co_return error(req, 400, deadline.error());
      if (*deadline && pending_deadlines_ >= kMaxPendingDeadlines)
        co_return error(req, 503,
                        "too many drain deadlines pending (" +
                            std::to_string(kMaxPendingDeadlines) + "); try again later");
      auto [err, inst] = registry_.drain(id, false);
      if (err)
        co_return make_error_response(*err, req.version(), req.keep_alive());
      spdlog::info("admin: draining instance {}", id);
      if (*deadline && hooks_.migrate_streams)
        migrate_at_deadline(co_await net::this_coro::executor, id, **deadline);
      co_return json_response(req, 200, instance_json(*inst));
    }
    if (undrain) {
      if (method != http::verb::post)
        co_return error(req, 405, "use POST on /admin/instances/{id}/undrain");
      auto [err, inst] = registry_.undrain(id);
      if (err)
        co_return make_error_response(*err, req.version(), req.keep_alive());
      spdlog::info("admin: instance {} back in service", id);
      co_return json_response(req, 200, instance_json(*inst));
    }
    if (!drain_only && method == http::verb::patch) {
      // Relabel or reweigh in place: the id, and so the metric series and
      // whatever policies remember, stay the same.
      auto j = json::parse(req.body(), nullptr, false);
      if (!j.is_object())
        co_return error(req, 400, "expected {\"labels\": {...}, \"weight\": N}");
      for (const auto& [k, v] : j.items()) {
        if (k != "labels" && k != "weight")
          co_return error(req, 400, "only labels and weight can change; not " + k);
      }
      auto meta = meta_fields(j);
      if (!meta)
        co_return error(req, 400, meta.error());
      auto [err, inst] = registry_.update(id, meta->labels, meta->weight);
      if (err)
        co_return make_error_response(*err, req.version(), req.keep_alive());
      spdlog::info("admin: instance {} relabelled/reweighed", id);
      co_return json_response(req, 200, instance_json(*inst));
    }
    if (!drain_only && method == http::verb::delete_) {
      auto [err, inst] = registry_.drain(id, true);
      if (err)
        co_return make_error_response(*err, req.version(), req.keep_alive());
      spdlog::info("admin: removing instance {} (after its in-flight requests)", id);
      co_return json_response(req, 202, instance_json(*inst));
    }
    if (!drain_only && method == http::verb::get) {
      auto inst = registry_.snapshot()->find(id);
      if (!inst)
        co_return error(req, 404, "no instance with id " + rest);
      co_return json_response(req, 200, instance_json(*inst));
    }
    co_return error(req, 405,
                    "use GET, PATCH or DELETE on /admin/instances/{id}, POST on .../drain or "
                    ".../undrain");
  }
  co_return error(req, 404, "no admin route for " + std::string(req.method_string()) + " " + path);
}

Result<std::optional<std::chrono::milliseconds>> AdminApi::drain_deadline(const Request& req) {
  std::optional<std::chrono::milliseconds> deadline;
  const std::string_view target = req.target();
  if (const auto q = target.find('?'); q != std::string_view::npos) {
    auto items = query_items(target.substr(q + 1));
    if (!items)
      return fail("query: " + items.error());
    for (const auto& [k, v] : *items) {
      if (k != "deadline")
        continue;
      auto d = config_detail::parse_duration(v);
      if (!d)
        return fail("deadline: " + d.error());
      deadline = *d;
    }
  }
  if (!req.body().empty()) {
    const auto j = json::parse(req.body(), nullptr, false);
    if (!j.is_object())
      return fail(R"(expected no body or {"deadline_ms": N})");
    if (const auto it = j.find("deadline_ms"); it != j.end()) {
      if (!it->is_number_unsigned() || it->get<std::uint64_t>() == 0)
        return fail("deadline_ms must be a positive integer");
      deadline = std::chrono::milliseconds(it->get<std::uint64_t>());
    }
  }
  if (deadline && *deadline > kMaxDrainDeadline)
    return fail("the deadline may be at most 24h");
  return deadline;
}

void AdminApi::migrate_at_deadline(net::any_io_executor ex, std::uint64_t id,
                                   std::chrono::milliseconds deadline) {
  ++pending_deadlines_;
  // The api outlives its listener's coroutines: the timer holds it.
  net::co_spawn(
      ex,
      [self = shared_from_this(), id, deadline]() -> net::awaitable<void> {
        net::steady_timer timer(co_await net::this_coro::executor, deadline);
        co_await timer.async_wait(use_tuple);
        --self->pending_deadlines_;
        // Undrained (or gone) meanwhile: its streams stay where they are.
        const auto inst = self->registry_.snapshot()->find(id);
        if (!inst || inst->state() != InstanceState::draining)
          co_return;
        spdlog::info("admin: instance {}'s drain deadline passed; moving its streams", id);
        self->hooks_.migrate_streams(id);
      },
      net::detached);
}

namespace {

// One admin connection: requests one after another until the client
// closes, idles past `idle_timeout` or sends something unreadable.
net::awaitable<void> admin_session(tcp::socket socket, std::shared_ptr<AdminApi> api,
                                   std::shared_ptr<net::ssl::context> tls,
                                   std::chrono::milliseconds idle_timeout) {
  MaybeTlsStream stream(std::move(socket));
  if (tls) {
    // Bounded as a request is: a peer that stalls the handshake, or speaks
    // plain HTTP to it, is closed.
    stream.expires_after(idle_timeout);
    auto [ec] =
        co_await stream.start_tls(*tls).async_handshake(net::ssl::stream_base::server, use_tuple);
    if (ec) {
      spdlog::debug("admin: TLS handshake failed: {}", ec.message());
      stream.close();
      co_return;
    }
  }
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(64 * 1024);
    parser.body_limit(1u << 20);  // admin bodies are small JSON documents
    stream.expires_after(idle_timeout);
    auto [ec, n] = co_await http::async_read(stream, buffer, parser, use_tuple);
    if (ec)
      break;
    auto req = parser.release();
    auto res = co_await api->handle(req);
    if (!co_await write_response(stream, res) || !req.keep_alive())
      break;
  }
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
}

}  // namespace

net::awaitable<void> serve_admin(tcp::acceptor& acceptor, std::shared_ptr<AdminApi> api,
                                 const ListenerTls* tls, std::chrono::milliseconds idle_timeout) {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(use_tuple);
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open())
        co_return;
      // Out of descriptors, say: try again shortly rather than spin.
      net::steady_timer t(acceptor.get_executor(), std::chrono::milliseconds(50));
      co_await t.async_wait(use_tuple);
      continue;
    }
    // The context current now: a reload swaps it for later connections.
    net::co_spawn(
        acceptor.get_executor(),
        admin_session(std::move(socket), api, tls ? tls->current() : nullptr, idle_timeout),
        net::detached);
  }
}

}  // namespace pdgate
