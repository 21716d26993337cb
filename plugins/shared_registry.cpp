#include "plugins/shared_registry.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>

#include "plugins/redis_connection.hpp"
#include "plugins/shared_registry_document.hpp"

namespace pdgate {

namespace net = boost::asio;
using json = nlohmann::json;

namespace {

// Messages carry changes at once; this check is the safety net for a
// message lost while the subscriber was disconnected.
constexpr auto kCheckInterval = std::chrono::seconds(2);
// How soon a local change that Redis refused is tried again.
constexpr auto kRetryInterval = std::chrono::milliseconds(250);
// How long instances that passed validation wait for others to join their
// batch before they are added.
constexpr auto kAddBatchDelay = std::chrono::milliseconds(10);

// The cluster's id of an engine (core/upstream/instance_ids.hpp): the one the ids hash keeps for
// its cluster_id_key, else the next `ranks` of the counter, kept there for good (so an engine
// removed and added again, and every replica restarted, gets it back). `wanted`, the id a replica
// already serves the engine under, refills a hash Redis lost (a restart without persistence) rather
// than hand out another. The hash is bounded (100,000 engines ever listed, dns:// addresses
// included): past it an engine gets no id ('') and is numbered locally.
// Returned as a string, as the hash holds it; the replica checks it
// (parse_cluster_id).
#define PDGATE_CLUSTER_ID_LUA                                          \
  "local function cluster_id(hash, counter, key, ranks, wanted)\n"     \
  "  local id = redis.call('HGET', hash, key)\n"                       \
  "  if id then return id end\n"                                       \
  "  if redis.call('HLEN', hash) >= 100000 then return '' end\n"       \
  "  local n = tonumber(ranks)\n"                                      \
  "  local w = tonumber(wanted)\n"                                     \
  "  if w then\n"                                                      \
  "    redis.call('HSET', hash, key, wanted)\n"                        \
  "    local top = tonumber(redis.call('GET', counter))\n"             \
  "    if not top or top < w + n - 1 then\n"                           \
  "      redis.call('SET', counter, string.format('%d', w + n - 1))\n" \
  "    end\n"                                                          \
  "    return wanted\n"                                                \
  "  end\n"                                                            \
  "  id = redis.call('INCRBY', counter, n) - n + 1\n"                  \
  "  redis.call('HSET', hash, key, string.format('%d', id))\n"         \
  "  return string.format('%d', id)\n"                                 \
  "end\n"
// KEYS: the ids hash, the counter. ARGV: a key and a rank count per engine.
constexpr std::string_view kIdsScript = PDGATE_CLUSTER_ID_LUA R"(
local out = {}
for i = 1, #ARGV - 1, 2 do
  out[#out + 1] = cluster_id(KEYS[1], KEYS[2], ARGV[i], ARGV[i + 1], nil)
end
return out
)";

// KEYS: document, version, channel, the ids hash, the counter. ARGV:
// field, entry JSON, "1" for an announcement (written only if the field
// is absent), the tombstone TTL in seconds, "1" for an add through the
// admin API, the engine's id key, rank count and the id this replica
// serves it under ("" for a local one): the entry is written with the
// cluster's id. A tombstone ("removed", stamped with Redis' clock) holds for the
// TTL: a stale "active" for the same field (a replica that has not heard
// of the removal yet) does not undo it meanwhile. An add does: it is an
// operator's word, newer than the removal. Every write drops the
// tombstones past it, so the document does not keep every instance ever
// removed.
constexpr std::string_view kMergeScript = PDGATE_CLUSTER_ID_LUA R"(
local doc = redis.call('GET', KEYS[1])
local t = {}
if doc then t = cjson.decode(doc) end
if type(t) ~= 'table' then t = {} end
local now = tonumber(redis.call('TIME')[1])
local ttl = tonumber(ARGV[4])
for k, e in pairs(t) do
  if type(e) == 'table' and e['state'] == 'removed' and
     (type(e['removed_at']) ~= 'number' or now - e['removed_at'] > ttl) then
    t[k] = nil
  end
end
local old = t[ARGV[1]]
if old and ARGV[3] == '1' then return 0 end
if old and old['state'] == 'removed' and ARGV[5] ~= '1' then return 0 end
local e = cjson.decode(ARGV[2])
if e['state'] == 'removed' then e['removed_at'] = now end
e['id'] = tonumber(cluster_id(KEYS[4], KEYS[5], ARGV[6], ARGV[7], ARGV[8]))
t[ARGV[1]] = e
redis.call('SET', KEYS[1], cjson.encode(t))
local v = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', KEYS[3], v)
return v
)";
#undef PDGATE_CLUSTER_ID_LUA

// What this replica reads of the document, whoever wrote it: a document
// past kMaxRegistryDocumentBytes is not read at all (it is reported),
// entries past kMaxRegistryDocumentEntries are refused and counted
// (plugins/shared_registry_document.hpp), and no instance is adopted from
// it once the replica serves kMaxLearntInstances besides those of its
// flags and file (whether learnt from Redis or added through its own
// admin API: both are shared).
constexpr std::size_t kMaxLearntInstances = 10'000;

// A reply that is not the one expected, for a log line.
std::string reply_text(const RedisReply& r) {
  return r.text.empty() ? std::string("no reply") : r.text.substr(0, 200);
}

// Where the cluster's ids are kept.
struct IdKeys {
  std::string hash;
  std::string counter;
  explicit IdKeys(const std::string& prefix)
      : hash(prefix + "instance_ids"), counter(prefix + "instance_ids:next") {}
};

// Engines per EVAL: a bounded command whatever the caller asks.
constexpr std::size_t kIdsPerCall = 512;

// The cluster's id of each engine (0 where Redis did not answer in time,
// or answered something that is not an id: the registry numbers that one).
net::awaitable<std::vector<std::uint64_t>> ask_ids(std::shared_ptr<RedisConnection> conn,
                                                   IdKeys keys, std::vector<IdRequest> engines) {
  std::vector<std::uint64_t> out(engines.size(), 0);
  const std::string script(kIdsScript);
  const std::string eval_cmd = "EVAL", nkeys = "2";
  for (std::size_t first = 0; first < engines.size(); first += kIdsPerCall) {
    const std::size_t n = std::min(kIdsPerCall, engines.size() - first);
    std::vector<std::string> texts;
    texts.reserve(2 * n);
    for (std::size_t k = first; k < first + n; ++k) {
      const auto& e = engines[k];
      texts.push_back(cluster_id_key(e.role, e.url, e.dp_size));
      texts.push_back(std::to_string(std::max<std::uint32_t>(e.dp_size, 1)));
    }
    std::vector<std::string_view> eval = {eval_cmd, script, nkeys, keys.hash, keys.counter};
    eval.insert(eval.end(), texts.begin(), texts.end());
    auto r = co_await conn->command(std::move(eval));
    if (r.type != RedisReply::Type::array || r.elements.size() != n) {
      spdlog::warn("shared registry: no instance ids from Redis ({}); numbered locally",
                   reply_text(r));
      co_return out;
    }
    for (std::size_t k = 0; k < n; ++k) {
      const auto& el = r.elements[k];
      if (el.type == RedisReply::Type::string)
        out[first + k] =
            parse_cluster_id(el.text, std::max<std::uint32_t>(engines[first + k].dp_size, 1));
      if (out[first + k] == 0) {
        spdlog::warn(
            "shared registry: Redis keeps no usable id for {} (got '{}'); numbered locally",
            texts[2 * k], el.text.substr(0, 40));
      }
    }
  }
  co_return out;
}

// The registry's id source: asks on the shared registry's connection, on
// its executor, whoever calls.
class RedisInstanceIds final : public InstanceIds {
 public:
  RedisInstanceIds(net::any_io_executor ex, std::shared_ptr<RedisConnection> conn, IdKeys keys)
      : ex_(std::move(ex)), conn_(std::move(conn)), keys_(std::move(keys)) {}
  net::awaitable<std::vector<std::uint64_t>> ids(std::vector<IdRequest> engines) override {
    co_return co_await net::co_spawn(ex_, ask_ids(conn_, keys_, std::move(engines)),
                                     net::use_awaitable);
  }

 private:
  net::any_io_executor ex_;
  std::shared_ptr<RedisConnection> conn_;
  IdKeys keys_;
};

}  // namespace

ClusterIds SharedRegistry::config_ids(const Config& cfg, RedisClientContext redis,
                                      std::chrono::milliseconds budget) {
  std::vector<IdRequest> engines;
  for (const auto* list : {&cfg.prefill, &cfg.decode, &cfg.encode}) {
    for (const auto& s : *list)
      engines.push_back({s.role, s.url, s.dp_size});
  }
  ClusterIds out;
  auto endpoint = parse_redis_url(cfg.redis_url);
  if (engines.empty() || !endpoint)
    return out;
  // Declared before the loop, which they outlive: the handlers it still
  // holds when destroyed refer to them. The connection is declared after
  // the loop, so it is gone before the loop is: its timer and socket
  // belong to the loop's services (the other order freed them first).
  RedisConnectionsShared shared;
  std::vector<std::uint64_t> ids;
  net::io_context ioc;
  std::shared_ptr<RedisConnection> conn;
  auto ask = [&]() -> net::awaitable<void> {
    ids = co_await ask_ids(conn, IdKeys(cfg.redis_key_prefix), engines);
    conn->stop();
  };
  RedisConnectionSettings settings;
  settings.endpoint = std::move(*endpoint);
  settings.context = std::move(redis);
  settings.connect_timeout = budget;
  settings.command_timeout = budget;
  conn = RedisConnection::create(ioc.get_executor(), settings, shared);
  conn->start();
  net::co_spawn(ioc, ask(), net::detached);
  // Bounded: a Redis that does not answer costs the start this much, and
  // the instances are numbered locally.
  ioc.run_for(2 * budget + std::chrono::milliseconds(100));
  conn->stop();
  // Let what the stop ended finish (a command cut off, the reader), so no
  // handler left in the loop holds the connection when it is destroyed.
  ioc.restart();
  ioc.run_for(std::chrono::milliseconds(200));
  conn.reset();
  for (std::size_t k = 0; k < ids.size(); ++k) {
    if (ids[k] != 0)
      out.emplace(cluster_id_key(engines[k].role, engines[k].url, engines[k].dp_size), ids[k]);
  }
  if (out.size() < engines.size()) {
    spdlog::warn(
        "shared registry: {} of {} configured instance(s) got no id from Redis in time; they "
        "are numbered from {} on until a restart",
        engines.size() - out.size(), engines.size(), kLocalIdBase);
  }
  return out;
}

SharedRegistry::SharedRegistry(const Config& cfg, Registry& registry, const LoopGuard& loop_guard,
                               std::shared_ptr<const EngineTls> engine_tls,
                               RedisClientContext redis)
    : cfg_(cfg),
      registry_(registry),
      loop_guard_(loop_guard),
      engine_tls_(std::move(engine_tls)),
      redis_(std::move(redis)),
      shared_(std::make_unique<RedisConnectionsShared>()) {}

SharedRegistry::~SharedRegistry() {
  // The source's connection counts itself in shared_, which goes with us.
  registry_.set_id_source(nullptr);
  if (subscriber_)
    subscriber_->stop();
  if (conn_)
    conn_->stop();
}

void SharedRegistry::queue(const Instance& i, const std::string& state, bool announce) {
  // An add is written as "active" that may replace a removal's tombstone.
  const bool added = state == "added";
  json entry = {{"role", to_string(i.spec.role)},
                {"url", i.spec.url},
                {"labels", *i.labels()},
                {"weight", i.weight()},
                {"state", added ? "active" : state}};
  if (i.spec.dp_size > 1)
    entry["data_parallel_size"] = i.spec.dp_size;
  std::string field = std::string(to_string(i.spec.role)) + "|" + i.spec.url;
  // The engine's id is written into the entry by the merge script, from
  // the ids Redis keeps (a replica does not choose it).
  std::string id_key = cluster_id_key(i.spec.role, i.spec.url, i.spec.dp_size);
  std::string ranks = std::to_string(std::max<std::uint32_t>(i.spec.dp_size, 1));
  // Rank 0's id (ranks follow it), unless this replica numbered it itself.
  const std::uint64_t first = i.spec.dp_rank ? i.id - *i.spec.dp_rank : i.id;
  std::string wanted = first < kLocalIdBase ? std::to_string(first) : std::string();
  std::lock_guard lock(mu_);
  // One entry per instance: the latest state replaces a queued one, so the
  // queue stays bounded however long Redis is away. A queued add stays an
  // add (a drain right after it still replaces the tombstone).
  for (auto& c : pending_) {
    if (c.field == field) {
      if (!announce)
        c = {std::move(field), entry.dump(),     false, added || c.added, std::move(id_key),
             std::move(ranks), std::move(wanted)};
      return;
    }
  }
  pending_.push_back({std::move(field), entry.dump(), announce, added, std::move(id_key),
                      std::move(ranks), std::move(wanted)});
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
  auto validator = UpstreamValidator::create(cfg_, loop_guard_, engine_tls_);
  if (!validator)
    return fail(validator.error());
  validator_.emplace(std::move(*validator));
  ex_ = ex;
  add_timer_.emplace(ex);
  RedisConnectionSettings settings;
  settings.endpoint = std::move(*endpoint);
  settings.context = redis_;
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
  // Ids are the cluster's from now on: asked of Redis before an instance
  // is added (admin API, reloads, dns:// sources, entries without one).
  registry_.set_id_source(
      std::make_shared<RedisInstanceIds>(ex, conn_, IdKeys(cfg_.redis_key_prefix)));
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
  RegistryDocument doc = parse_registry_document(document);
  if (doc.problem) {
    report_document(*doc.problem);
    return;
  }
  if (doc.past_bound > 0) {
    for (std::size_t k = 0; k < doc.past_bound; ++k)
      registry_.note_shared_refusal();
    report_document("the document has " + std::to_string(doc.past_bound) +
                    " entries past the first " + std::to_string(kMaxRegistryDocumentEntries) +
                    "; they are refused");
  }
  // Instances not from this replica's flags or file, towards
  // kMaxLearntInstances.
  std::size_t learnt = 0;
  for (const auto& i : registry_.snapshot()->all())
    learnt += i->from_config ? 0 : 1;
  learnt += validating_.size();
  // A validation that started this long ago has ended however it went
  // (name resolution and the model check are each bounded by
  // --model-check-timeout): its entry is validated afresh.
  const std::int64_t stale_after = 2 * cfg_.model_check_timeout.count() + 1000;
  const std::int64_t now = steady_now_ms();
  std::vector<Learnt> fresh;
  for (auto& e : doc.entries) {
    if (e.refused) {
      registry_.note_shared_refusal();
      log_refusal(to_string(e.role), e.url, *e.refused);
      continue;
    }
    RegistryEntry* entry = &e;
    std::string key = std::string(to_string(entry->role)) + "|" + entry->url;
    const InstancePtr local = registry_.find(entry->role, entry->url);
    auto pending = validating_.find(key);
    if (entry->state == "active") {
      if (local) {
        // Another replica undrained, relabelled or reweighed it.
        if (local->draining.load() && !local->remove_when_idle.load()) {
          registry_.undrain(local->id, false);
          spdlog::info("shared registry: undrained {}", entry->url);
        }
        registry_.update(local->id, entry->labels, entry->weight, false);
        continue;
      }
      if (pending != validating_.end() &&
          (pending->second.started_ms == 0 || now - pending->second.started_ms < stale_after)) {
        pending->second.wanted = true;
        continue;
      }
      auto spec = parse_upstream(entry->role, entry->url);
      if (!spec)
        continue;
      if (learnt >= kMaxLearntInstances) {
        registry_.note_shared_refusal();
        log_refusal(to_string(entry->role), entry->url,
                    "this replica already serves " + std::to_string(kMaxLearntInstances) +
                        " instances learnt from Redis or the admin API");
        continue;
      }
      // Every rank is an instance this replica serves.
      learnt += entry->dp_size;
      spec->role = entry->role;
      spec->dp_size = entry->dp_size;
      fresh.push_back({std::move(key), NewInstance{std::move(*spec), std::move(entry->labels),
                                                   entry->weight, false, entry->id}});
      continue;
    }
    // No longer active: an add still being validated is not made.
    if (pending != validating_.end())
      pending->second.wanted = false;
    // An instance this replica's flags or file list is the operator's:
    // another replica's drain or removal does not take it out of service
    // here (else one write to Redis could drain every replica's engines).
    if (local && local->from_config)
      continue;
    if ((entry->state == "draining" || entry->state == "removed") && local &&
        (!local->draining.load() ||
         (entry->state == "removed" && !local->remove_when_idle.load()))) {
      registry_.drain(local->id, entry->state == "removed", false);
      spdlog::info("shared registry: {} {}", entry->state, entry->url);
    }
    if (entry->state == "draining" && local)
      registry_.update(local->id, entry->labels, entry->weight, false);
  }
  learn(std::move(fresh));
}

void SharedRegistry::learn(std::vector<Learnt> fresh) {
  if (fresh.empty())
    return;
  std::size_t skipped = 0;
  for (auto& l : fresh) {
    // Bounded whatever the document holds; what is skipped is picked up
    // at a later document change.
    if (validating_.size() >= kMaxValidating) {
      ++skipped;
      continue;
    }
    validating_[l.key] = Validating{};
    to_validate_.push_back(std::move(l));
  }
  if (skipped > 0) {
    spdlog::warn("shared registry: {} new instance(s) left for a later change ({} validating)",
                 skipped, validating_.size());
  }
  while (validators_running_ < std::max(1u, cfg_.health_max_concurrency) && !to_validate_.empty()) {
    ++validators_running_;
    net::co_spawn(ex_, validate_queued(), [this](const std::exception_ptr& e) {
      --validators_running_;
      if (e)
        spdlog::error("shared registry: a validation failed unexpectedly");
    });
  }
}

net::awaitable<void> SharedRegistry::validate_queued() {
  while (!to_validate_.empty()) {
    Learnt l = std::move(to_validate_.front());
    to_validate_.pop_front();
    auto pending = validating_.find(l.key);
    if (pending == validating_.end() || !pending->second.wanted) {
      if (pending != validating_.end())
        validating_.erase(pending);
      continue;
    }
    pending->second.started_ms = steady_now_ms();
    auto refused = co_await validator_->check(l.instance.spec);
    if (refused) {
      validating_.erase(l.key);
      registry_.note_shared_refusal();
      log_refusal(to_string(l.instance.spec.role), l.instance.spec.url, refused->message);
      continue;
    }
    // An entry without an id (an older replica wrote it): the cluster's,
    // asked before the instance is listed.
    if (l.instance.id == 0) {
      std::vector<IdRequest> one = {
          {l.instance.spec.role, l.instance.spec.url, l.instance.spec.dp_size}};
      l.instance.id =
          (co_await ask_ids(conn_, IdKeys(cfg_.redis_key_prefix), std::move(one))).front();
    }
    passed_.push_back(std::move(l));
    // What passes within kAddBatchDelay is added as one batch: one new
    // instance set, not one per instance (each is a copy of the set).
    if (!add_posted_) {
      add_posted_ = true;
      add_timer_->expires_after(kAddBatchDelay);
      // Aborted only when the registry is being destroyed.
      add_timer_->async_wait([this](const boost::system::error_code& ec) {
        if (ec != net::error::operation_aborted)
          add_passed();
      });
    }
  }
}

void SharedRegistry::add_passed() {
  add_posted_ = false;
  std::vector<NewInstance> batch;
  for (auto& l : passed_) {
    const auto it = validating_.find(l.key);
    const bool wanted = it != validating_.end() && it->second.wanted;
    if (it != validating_.end())
      validating_.erase(it);
    if (wanted)
      batch.push_back(std::move(l.instance));
  }
  passed_.clear();
  if (batch.empty())
    return;
  std::size_t added = 0;
  std::vector<NewInstance> asked = batch;
  auto outcomes = registry_.add(std::move(batch), false);
  // An id another instance has here (two replicas refilled a Redis that
  // lost its ids, or a hand-written document): the engine is still
  // served, numbered locally, and the clash is logged.
  std::vector<NewInstance> clashed;
  for (std::size_t k = 0; k < outcomes.size(); ++k) {
    if (outcomes[k].instance || asked[k].id == 0 ||
        registry_.find(asked[k].spec.role, asked[k].spec.url))
      continue;
    log_refusal(to_string(asked[k].spec.role), asked[k].spec.url, outcomes[k].error->message, true);
    clashed.push_back(std::move(asked[k]));
    clashed.back().id = 0;
  }
  for (auto& o : registry_.add(std::move(clashed), false))
    outcomes.push_back(std::move(o));
  for (const auto& o : outcomes) {
    if (!o.instance)
      continue;
    if (++added <= 10) {
      spdlog::info("shared registry: learnt {} instance {}", to_string(o.instance->spec.role),
                   o.instance->spec.url);
    }
  }
  if (added > 10)
    spdlog::info("shared registry: learnt {} more instance(s)", added - 10);
}

void SharedRegistry::report_document(const std::string& why) {
  registry_.note_shared_document_error(why);
  // Once a second at most: the loop retries every few seconds, and a
  // writer may keep the document bad.
  const std::int64_t now = steady_now_ms();
  if (now - last_document_log_ms_ < 1000)
    return;
  last_document_log_ms_ = now;
  spdlog::error("shared registry: {} (pdgate_shared_registry_document_errors_total)", why);
}

void SharedRegistry::log_refusal(std::string_view role, std::string_view url, std::string_view why,
                                 bool used) {
  // At most one line a second: a document full of bad entries must not
  // flood the log.
  const std::int64_t now = steady_now_ms();
  if (now - last_refusal_log_ms_ < 1000) {
    ++refusals_not_logged_;
    return;
  }
  std::string more;
  if (refusals_not_logged_ > 0)
    more =
        " (and " + std::to_string(refusals_not_logged_) + " more refusal(s) since the last line)";
  spdlog::warn("shared registry: {} {} instance {} from Redis: {}{}",
               used ? "under a local id," : "not using", role, url.substr(0, 256), why, more);
  last_refusal_log_ms_ = now;
  refusals_not_logged_ = 0;
}

net::awaitable<void> SharedRegistry::loop() {
  auto ex = co_await net::this_coro::executor;
  net::steady_timer timer(ex);
  const std::string doc_key = cfg_.redis_key_prefix + "instances";
  const std::string version_key = cfg_.redis_key_prefix + "instances:version";
  const std::string channel = cfg_.redis_key_prefix + "instances:changed";
  const std::string script(kMergeScript);
  const std::string tombstone_ttl = std::to_string(kTombstoneTtl.count());
  const IdKeys ids_keys(cfg_.redis_key_prefix);
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
      const std::string nkeys = "5";
      const std::string eval_cmd = "EVAL";
      std::vector<std::string_view> eval;
      eval.emplace_back(eval_cmd);
      eval.emplace_back(script);
      eval.emplace_back(nkeys);
      eval.emplace_back(doc_key);
      eval.emplace_back(version_key);
      eval.emplace_back(channel);
      eval.emplace_back(ids_keys.hash);
      eval.emplace_back(ids_keys.counter);
      const std::string announce = next.announce ? "1" : "0";
      const std::string added = next.added ? "1" : "0";
      eval.emplace_back(next.field);
      eval.emplace_back(next.entry);
      eval.emplace_back(announce);
      eval.emplace_back(tombstone_ttl);
      eval.emplace_back(added);
      eval.emplace_back(next.id_key);
      eval.emplace_back(next.ranks);
      eval.emplace_back(next.wanted);
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
      // Its size first: a document too large is reported and not read (a
      // writer cannot make every replica allocate and parse it).
      const std::string strlen_cmd = "STRLEN";
      std::vector<std::string_view> get_len = {strlen_cmd, doc_key};
      auto n = co_await conn_->command(std::move(get_len));
      if (n.type != RedisReply::Type::integer) {
        report_document("could not read the document's size from Redis: " + reply_text(n));
        reload_ = true;
      } else if (static_cast<std::uint64_t>(n.integer) > kMaxRegistryDocumentBytes) {
        report_document("the document is " + std::to_string(n.integer) + " bytes, more than " +
                        std::to_string(kMaxRegistryDocumentBytes) +
                        "; instances are left as they are");
        seen_version_ = v.text;
      } else {
        std::vector<std::string_view> get_doc = {get_cmd, doc_key};
        auto d = co_await conn_->command(std::move(get_doc));
        if (d.type == RedisReply::Type::string) {
          apply(d.text);
          seen_version_ = v.text;
        } else if (d.type != RedisReply::Type::nil) {
          // Not read (a timeout, an error): said so, and read again at
          // the next round rather than waiting for another change.
          report_document("could not read the document (" + std::to_string(n.integer) +
                          " bytes) from Redis: " + reply_text(d));
          reload_ = true;
        }
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
