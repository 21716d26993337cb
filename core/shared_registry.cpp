#include "core/shared_registry.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>

#include "plugins/redis_connection.hpp"

namespace pdgate {

namespace net = boost::asio;
using json = nlohmann::json;

namespace {

// Messages carry changes at once; this check is the safety net for a
// message lost while the subscriber was disconnected.
constexpr auto kCheckInterval = std::chrono::seconds(2);
// How soon a local change that Redis refused is tried again.
constexpr auto kRetryInterval = std::chrono::milliseconds(250);

// KEYS: document, version, channel. ARGV: field, entry JSON, "1" for an
// announcement (written only if the field is absent). A tombstone
// ("removed") is final: a stale "active" for the same field does not undo
// it.
constexpr std::string_view kMergeScript = R"(
local doc = redis.call('GET', KEYS[1])
local t = {}
if doc then t = cjson.decode(doc) end
local old = t[ARGV[1]]
if old and (old['state'] == 'removed' or ARGV[3] == '1') then return 0 end
t[ARGV[1]] = cjson.decode(ARGV[2])
redis.call('SET', KEYS[1], cjson.encode(t))
local v = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', KEYS[3], v)
return v
)";

}  // namespace

SharedRegistry::SharedRegistry(const Config& cfg, Registry& registry)
    : cfg_(cfg), registry_(registry), shared_(std::make_unique<RedisConnectionsShared>()) {}

SharedRegistry::~SharedRegistry() {
  if (subscriber_)
    subscriber_->stop();
  if (conn_)
    conn_->stop();
}

void SharedRegistry::queue(const Instance& i, const std::string& state, bool announce) {
  json entry = {{"role", to_string(i.spec.role)},
                {"url", i.spec.url},
                {"labels", i.labels},
                {"weight", i.weight},
                {"state", state}};
  std::string field = std::string(to_string(i.spec.role)) + "|" + i.spec.url;
  std::lock_guard lock(mu_);
  // One entry per instance: the latest state replaces a queued one, so the
  // queue stays bounded however long Redis is away.
  for (auto& c : pending_) {
    if (c.field == field) {
      if (!announce)
        c = {std::move(field), entry.dump(), false};
      return;
    }
  }
  pending_.push_back({std::move(field), entry.dump(), announce});
}

void SharedRegistry::wake(bool reload) {
  reload_ = reload_ || reload;
  woken_ = true;
  if (sleep_ != nullptr)
    sleep_->cancel();
}

Result<bool> SharedRegistry::start(net::any_io_executor ex) {
  auto endpoint = parse_redis_url(cfg_.redis_url);
  if (!endpoint)
    return fail(endpoint.error());
  ex_ = ex;
  RedisConnectionSettings settings;
  settings.endpoint = std::move(*endpoint);
  settings.command_timeout = std::chrono::milliseconds(500);
  conn_ = RedisConnection::create(ex, settings, *shared_);
  subscriber_ = RedisConnection::create(ex, settings, *shared_);
  // A message is a change somewhere: reload. A (re)subscription may have
  // missed messages: reload too.
  subscriber_->subscribe(
      cfg_.redis_key_prefix + "instances:changed", [this](std::string_view) { wake(true); },
      [this] { wake(true); });
  conn_->start();
  subscriber_->start();
  registry_.on_change = [this](const Instance& i, const std::string& state) {
    queue(i, state);
    // Changes come from the admin API's thread or a worker's (the client
    // port's /instances/add): the loop runs on ex_.
    net::post(ex_, [this] { wake(false); });
  };
  // The instances from the command line are announced too, so a replica
  // started with fewer flags learns them; one Redis already knows keeps
  // the state Redis has (a drain made through the admin API stands).
  for (const auto& i : registry_.snapshot()->all())
    queue(*i, "active", true);
  net::co_spawn(ex, loop(), net::detached);
  return true;
}

void SharedRegistry::apply(const std::string& document) {
  auto doc = json::parse(document, nullptr, false);
  if (!doc.is_object())
    return;
  for (const auto& [field, e] : doc.items()) {
    if (!e.is_object())
      continue;
    const auto role = role_from_string(e.value("role", std::string()));
    const std::string url = e.value("url", std::string());
    const std::string state = e.value("state", std::string());
    if (!role || url.empty())
      continue;
    const InstancePtr local = registry_.find(*role, url);
    if (state == "active" && !local) {
      auto spec = parse_upstream(*role, url);
      if (!spec)
        continue;
      spec->role = *role;
      std::map<std::string, std::string> labels;
      if (e.contains("labels") && e["labels"].is_object()) {
        for (const auto& [k, v] : e["labels"].items()) {
          if (v.is_string())
            labels[k] = v.get<std::string>();
        }
      }
      const unsigned weight = e.value("weight", 1u);
      auto [err, inst] = registry_.add(*spec, std::move(labels), weight, false);
      if (inst)
        spdlog::info("shared registry: learnt {} instance {}", to_string(*role), url);
    } else if ((state == "draining" || state == "removed") && local &&
               (!local->draining.load() ||
                (state == "removed" && !local->remove_when_idle.load()))) {
      registry_.drain(local->id, state == "removed", false);
      spdlog::info("shared registry: {} {}", state, url);
    }
  }
}

net::awaitable<void> SharedRegistry::loop() {
  auto ex = co_await net::this_coro::executor;
  net::steady_timer timer(ex);
  const std::string doc_key = cfg_.redis_key_prefix + "instances";
  const std::string version_key = cfg_.redis_key_prefix + "instances:version";
  const std::string channel = cfg_.redis_key_prefix + "instances:changed";
  const std::string script(kMergeScript);
  for (;;) {
    // Local changes first, in order; one that fails stays queued and is
    // retried (Redis may be down: we keep serving and catch up later).
    bool retry = false;
    for (;;) {
      Change next;
      {
        std::lock_guard lock(mu_);
        if (pending_.empty())
          break;
        next = pending_.front();
      }
      // Named argument vectors: GCC 12 miscompiles braced lists with string
      // literals inside co_await.
      const std::string nkeys = "3";
      const std::string eval_cmd = "EVAL";
      std::vector<std::string_view> eval;
      eval.emplace_back(eval_cmd);
      eval.emplace_back(script);
      eval.emplace_back(nkeys);
      eval.emplace_back(doc_key);
      eval.emplace_back(version_key);
      eval.emplace_back(channel);
      const std::string announce = next.announce ? "1" : "0";
      eval.emplace_back(next.field);
      eval.emplace_back(next.entry);
      eval.emplace_back(announce);
      auto r = co_await conn_->command(std::move(eval));
      if (r.type != RedisReply::Type::integer) {
        retry = true;
        break;
      }
      std::lock_guard lock(mu_);
      // Written; unless a newer state for the same instance replaced it
      // meanwhile (then that one is written next).
      if (!pending_.empty() && pending_.front() == next)
        pending_.pop_front();
    }
    const std::string get_cmd = "GET";
    std::vector<std::string_view> get_version = {get_cmd, version_key};
    auto v = co_await conn_->command(std::move(get_version));
    if (v.type == RedisReply::Type::nil && !retry) {
      // No document (a Redis that lost its data, or flushed): announce
      // what this replica serves so the others, and later ones, learn it.
      for (const auto& i : registry_.snapshot()->all())
        queue(*i,
              i->remove_when_idle.load() ? "removed"
              : i->draining.load()       ? "draining"
                                         : "active",
              true);
      std::lock_guard lock(mu_);
      retry = !pending_.empty();
    } else if (v.type == RedisReply::Type::string && (reload_ || v.text != seen_version_)) {
      reload_ = false;
      std::vector<std::string_view> get_doc = {get_cmd, doc_key};
      auto d = co_await conn_->command(std::move(get_doc));
      if (d.type == RedisReply::Type::string) {
        apply(d.text);
        seen_version_ = v.text;
      }
    }
    if (!woken_) {
      timer.expires_after(retry ? std::chrono::milliseconds(kRetryInterval)
                                : std::chrono::milliseconds(kCheckInterval));
      sleep_ = &timer;
      co_await timer.async_wait(net::as_tuple(net::use_awaitable));
      sleep_ = nullptr;
    }
    woken_ = false;
  }
}

}  // namespace pdgate
